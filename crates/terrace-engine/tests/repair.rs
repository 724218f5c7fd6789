//! Repair, evacuation, replacement and resync, on memory disks: the
//! redundancy template (lose what the layout tolerates, read everything,
//! repair, verify redundancy, lose another, read everything), plus moves
//! under client load, jobs surviving a restart, and jobs that fail.

mod common;

use std::sync::Arc;

use common::*;
use terrace_engine::io::delay::{DelayDevice, DelayPolicy};
use terrace_engine::layout::Layout;
use terrace_engine::meta::{DiskIndex, DiskState, JobKind, JobState, SpaceRole, Usage};
use terrace_engine::{
    verify_space, ClearRefusal, EngineError, ImportOptions, JobAction, Pool, PoolConfig, Space,
    SpaceConfig, SpaceHealth, SpaceSize,
};

const DISK_BYTES: u64 = 4 << 20;

async fn fill(space: &Space, seed: u64) -> Model {
    let mut model = Model::new(space.size_bytes());
    let data = SplitMix64::new(seed).bytes(space.size_bytes() as usize);
    space.write(0, bytes(data.clone()), false).await.unwrap();
    model.write(0, &data);
    model
}

async fn check(space: &Space, model: &Model) {
    let read = space.read(0, space.size_bytes()).await.unwrap();
    assert!(
        read[..] == model.bytes[..],
        "{} differs from what was written",
        space.name()
    );
}

async fn assert_redundant(space: &Space) {
    let report = verify_space(space).await.unwrap();
    assert_eq!(report.mismatched_rows, vec![], "{}", space.name());
    assert_eq!(
        report.skipped_rows,
        0,
        "{}: rows without full redundancy",
        space.name()
    );
}

/// Set the pool's repair and move bandwidth limit (0: none).
/// `retire-missing never`: a missing disk waits to come back, unrepaired.
async fn wait_for_missing_disks(pool: &Pool) {
    pool.set_settings(terrace_engine::meta::PoolSettings {
        retire_missing: terrace_engine::meta::RetireMissing::Never,
        ..pool.metadata().await.settings
    })
    .await
    .unwrap();
}

/// An 8 MiB 2-way mirror "m" over `columns`, in 4 KiB interleave units so
/// that a move has many rows, filled from `seed`.
async fn small_mirror(pool: &Pool, columns: u32, seed: u64) -> (Arc<Space>, Model) {
    let mut config = SpaceConfig::new("m", Layout::Mirror { copies: 2 }, SpaceSize::Bytes(8 << 20));
    config.columns = Some(columns);
    config.interleave_bytes = Some(4096);
    let space = pool.create_space(config).await.unwrap().space;
    let model = fill(&space, seed).await;
    (space, model)
}

fn disks_of(pool_metadata: &terrace_engine::meta::PoolMetadata, space: &str) -> Vec<DiskIndex> {
    let mut disks: Vec<DiskIndex> = pool_metadata
        .space(space)
        .unwrap()
        .extents
        .iter()
        .flat_map(|e| e.slabs.clone().unwrap())
        .map(|slab| slab.disk)
        .collect();
    disks.sort_unstable();
    disks.dedup();
    disks
}

#[test]
fn every_redundant_layout_survives_repairs_and_another_loss() {
    for (layout, name) in layouts()
        .into_iter()
        .filter(|(l, _)| l.failures_tolerated() > 0)
    {
        block_on(async {
            let disks = Disks::new(8, DISK_BYTES);
            let pool = create_pool(&disks).await;
            let mut config = SpaceConfig::new(name, layout, SpaceSize::Bytes(512 << 10));
            config.columns = Some(layout.min_columns().max(2));
            config.interleave_bytes = Some(8192);
            let space = pool.create_space(config).await.unwrap().space;
            let model = fill(&space, 11).await;
            let used = disks_of(&pool.metadata().await, name);
            let tolerated = layout.failures_tolerated() as usize;
            for disk in used.iter().take(tolerated) {
                disks.faults[usize::from(disk.0)].lose();
            }
            check(&space, &model).await;
            // A mirror reads each region from one copy, so reading may not
            // reach a lost disk; writing reaches every copy.
            space
                .write(0, bytes(model.bytes.clone()), false)
                .await
                .unwrap();
            check(&space, &model).await;
            assert!(
                matches!(space.health(), SpaceHealth::Degraded { survives: 0 }),
                "{name}"
            );
            // The default policy (auto) starts the repairs by itself.
            with_jobs(&pool, async {
                let statuses = jobs_settle(&pool).await;
                assert!(
                    statuses.iter().all(|s| s.state == JobState::Done),
                    "{name}: {statuses:?}"
                );
                assert_eq!(
                    statuses.len(),
                    tolerated,
                    "{name}: one repair per lost disk"
                );
            })
            .await;
            assert_eq!(space.health(), SpaceHealth::Healthy, "{name}");
            check(&space, &model).await;
            assert_redundant(&space).await;
            let metadata = pool.metadata().await;
            let now_used = disks_of(&metadata, name);
            for disk in used.iter().take(tolerated) {
                assert!(
                    !now_used.contains(disk),
                    "{name}: the lost disk still holds slabs"
                );
            }
            disks.faults[usize::from(now_used[0].0)].lose();
            check(&space, &model).await;
        });
    }
}

#[test]
fn repairs_keep_client_writes_and_prefer_hot_spares() {
    block_on(async {
        let disks = Disks::new(6, DISK_BYTES);
        let pool = create_pool(&disks).await;
        pool.set_disk_usage(DiskIndex(5), Usage::HotSpare)
            .await
            .unwrap();
        let mut config = SpaceConfig::new(
            "p",
            Layout::Parity { redundancy: 1 },
            SpaceSize::Bytes(1 << 20),
        );
        config.columns = Some(3);
        config.interleave_bytes = Some(4096);
        let space = pool.create_space(config).await.unwrap().space;
        let mut model = fill(&space, 3).await;
        let lost = disks_of(&pool.metadata().await, "p")[0];
        disks.faults[usize::from(lost.0)].lose();
        let mut rng = SplitMix64::new(77);
        with_jobs(&pool, async {
            // Keep writing while the repair runs.
            model
                .write_random_ranges(&space, &mut rng, 150, 32 << 10)
                .await;
            jobs_settle(&pool).await;
        })
        .await;
        check(&space, &model).await;
        assert_redundant(&space).await;
        let metadata = pool.metadata().await;
        assert!(
            disks_of(&metadata, "p").contains(&DiskIndex(5)),
            "the hot spare took the lost slabs"
        );
    });
}

/// A repair spreads its copying over the disks: each destination goes to
/// the disk with the least to read and write for the job so far, so that
/// no disk holds the repair up with much more than its share (by free
/// slabs alone, the destinations ignored which disks were already busy
/// as sources, and on a twelve-disk mirror some did twice the work).
#[test]
fn a_repair_spreads_its_reads_and_writes_over_the_disks() {
    block_on(async {
        let disks = Disks::new(12, 8 << 20);
        let pool = create_pool(&disks).await;
        let mut config = SpaceConfig::new(
            "m",
            Layout::Mirror { copies: 2 },
            SpaceSize::Bytes(12 << 20),
        );
        config.columns = Some(2);
        let space = pool.create_space(config).await.unwrap().space;
        fill(&space, 9).await;
        set_repair_rate(&pool, 4096).await;
        let lost = DiskIndex(0);
        disks.faults[0].lose();
        with_jobs(&pool, sleep(1500)).await;
        let metadata = pool.metadata().await;
        let job = metadata
            .jobs
            .iter()
            .find(|job| job.kind == JobKind::Repair { disk: lost } && job.is_active())
            .unwrap_or_else(|| panic!("the repair runs, slowly: {:?}", metadata.jobs));
        let extents = &metadata.space("m").unwrap().extents;
        let mut work = [0u32; 12];
        for step in &job.moves {
            let slabs = extents[step.extent as usize].slabs.as_ref().unwrap();
            // The other copy of the same column is read; the target written.
            let partner = usize::from(step.slot) ^ 1;
            work[usize::from(slabs[partner].disk.0)] += 1;
            work[usize::from(step.target.disk.0)] += 1;
        }
        assert_eq!(work[0], 0, "nothing on the lost disk");
        let total: u32 = work.iter().sum();
        let share = total.div_ceil(11);
        assert!(job.moves.len() >= 20, "{} moves", job.moves.len());
        assert!(
            work[1..].iter().all(|&w| w <= share + 1),
            "slabs read and written per disk: {work:?} (share {share})"
        );
    });
}

#[test]
fn a_repair_resumes_from_its_watermark_after_a_restart() {
    block_on(async {
        let disks = Disks::new(5, 16 << 20);
        let pool = create_pool(&disks).await;
        let (space, model) = small_mirror(&pool, 2, 5).await;
        set_repair_rate(&pool, 1 << 20).await;
        let lost = disks_of(&pool.metadata().await, "m")[0];
        disks.faults[usize::from(lost.0)].lose();
        // Run the repair for a while, then stop as a crash would: no close.
        with_jobs(&pool, sleep(1500)).await;
        let before = pool.metadata().await;
        let job = before
            .jobs
            .iter()
            .find(|j| j.kind == JobKind::Repair { disk: lost })
            .unwrap();
        assert!(
            job.is_active() && job.bytes_done > 0,
            "progress was persisted: {job:?}"
        );
        let persisted = job.bytes_done;
        drop(space);
        drop(pool);
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let resumed = pool.job_statuses().await;
        assert!(
            resumed[0].bytes_done >= persisted,
            "resumes where it stopped, not from 0: {resumed:?}"
        );
        set_repair_rate(&pool, 0).await;
        with_jobs(&pool, jobs_settle(&pool)).await;
        let space = pool.space("m").unwrap();
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// A write refused because more disks are away than the layout tolerates
/// records nothing missed for them: once they return the space is whole,
/// as it was (before, the write was recorded missed for both, neither
/// could be caught up from the other, and the extent stayed lost).
#[test]
fn a_write_refused_beyond_tolerance_leaves_the_returning_disks_whole() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let config = SpaceConfig::new(
            "p",
            Layout::Parity { redundancy: 1 },
            SpaceSize::Bytes(256 << 10),
        );
        let space = pool.create_space(config).await.unwrap().space;
        let model = fill(&space, 5).await;
        for away in [1, 2] {
            disks.faults[away].lose();
            pool.disk_gone(DiskIndex(away as u16), "pulled")
                .await
                .unwrap();
        }
        let refused = space.write(0, bytes(vec![0x77; 4096]), false).await;
        let refused = refused.unwrap_err().to_string();
        assert!(refused.contains("nothing was written"), "{refused}");
        for away in [1, 2] {
            disks.faults[away].restore();
            pool.bring_back(disks.devices[away].clone()).await.unwrap();
        }
        let settled = with_jobs(&pool, jobs_settle(&pool)).await;
        assert!(
            settled.iter().all(|job| job.state == JobState::Done),
            "{settled:?}"
        );
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

#[test]
fn evacuation_and_replacement_move_everything_off_a_healthy_disk() {
    block_on(async {
        let disks = Disks::new(5, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let mut config = SpaceConfig::new(
            "d",
            Layout::Parity { redundancy: 2 },
            SpaceSize::Bytes(512 << 10),
        );
        config.columns = Some(4);
        let space = pool.create_space(config).await.unwrap().space;
        let mut model = fill(&space, 8).await;
        let victim = disks_of(&pool.metadata().await, "d")[0];
        pool.start_evacuation(victim).await.unwrap();
        with_jobs(&pool, async {
            let (offset, length) = (4096u64, 64u64 << 10);
            let data = SplitMix64::new(1).bytes(length as usize);
            space
                .write(offset, bytes(data.clone()), false)
                .await
                .unwrap();
            model.write(offset, &data);
            jobs_settle(&pool).await;
        })
        .await;
        let metadata = pool.metadata().await;
        assert!(!disks_of(&metadata, "d").contains(&victim));
        assert_eq!(
            metadata.disks[usize::from(victim.0)].state,
            DiskState::Removed
        );
        let scanned =
            terrace_engine::scan(&disks.devices[usize::from(victim.0)..=usize::from(victim.0)])
                .await;
        assert_eq!(
            scanned[0].kind,
            terrace_engine::DeviceKind::Blank,
            "the released disk is blank"
        );
        // Let go of too: the same device may join again, as a new disk.
        let victim_device = disks.devices[usize::from(victim.0)].clone();
        let again = pool
            .add_disks(vec![terrace_engine::NewDisk::new(victim_device)])
            .await
            .unwrap();
        assert_ne!(again, vec![victim], "a new disk, not the removed one");
        check(&space, &model).await;
        assert_redundant(&space).await;
        // Replace: a new disk joins and takes every slab of an old one.
        let old = disks_of(&pool.metadata().await, "d")[1];
        let more = Disks::new(1, DISK_BYTES);
        let (new, _) = pool
            .replace_disk(old, more.new_disks().remove(0))
            .await
            .unwrap();
        with_jobs(&pool, jobs_settle(&pool)).await;
        let now = disks_of(&pool.metadata().await, "d");
        assert!(now.contains(&new) && !now.contains(&old));
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

#[test]
fn a_repair_without_room_is_recorded_once_and_retried_when_a_disk_joins() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        pool.set_settings(terrace_engine::meta::PoolSettings {
            retire_missing: terrace_engine::meta::RetireMissing::Always,
            ..pool.metadata().await.settings
        })
        .await
        .unwrap();
        let config = SpaceConfig::new("m", Layout::Mirror { copies: 2 }, SpaceSize::Bytes(1 << 20));
        let space = pool.create_space(config).await.unwrap().space;
        let model = fill(&space, 12).await;
        disks.faults[1].lose();
        let failed = |statuses: &[terrace_engine::JobStatus]| {
            statuses
                .iter()
                .filter(|s| s.state == JobState::Failed)
                .count()
        };
        with_jobs(&pool, async {
            // Writes find the loss; commits follow; the runner polls many
            // times meanwhile.
            for round in 0..40u64 {
                let data = SplitMix64::new(round).bytes(4096);
                let _ = space.write(round * 4096, bytes(data), false).await;
                sleep(10).await;
            }
        })
        .await;
        let statuses = pool.job_statuses().await;
        assert_eq!(failed(&statuses), 1, "{statuses:?}");
        assert!(statuses[0].reason.contains("no room"), "{statuses:?}");
        // A disk joins: the repair is tried again and finishes.
        let more = Disks::new(1, DISK_BYTES);
        pool.add_disks(more.new_disks()).await.unwrap();
        let statuses = with_jobs(&pool, jobs_settle(&pool)).await;
        assert!(
            statuses.iter().any(|s| s.state == JobState::Done),
            "{statuses:?}"
        );
        assert_eq!(failed(&statuses), 1, "{statuses:?}");
        drop(model);
        assert_redundant(&space).await;
    });
}

#[test]
fn a_refused_replacement_adds_no_disk_and_writes_nothing() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let mut config =
            SpaceConfig::new("m", Layout::Mirror { copies: 2 }, SpaceSize::Bytes(1 << 20));
        config.columns = Some(1);
        pool.create_space(config).await.unwrap();
        let old = disks_of(&pool.metadata().await, "m")[0];
        // The old disk is held by a paused evacuation.
        let held = pool.start_evacuation(old).await.unwrap();
        pool.job_action(held, JobAction::Pause).await.unwrap();
        let before = pool.metadata().await;
        let more = Disks::new(1, DISK_BYTES);
        let refused = pool
            .replace_disk(old, more.new_disks().remove(0))
            .await
            .unwrap_err();
        assert!(
            matches!(refused, EngineError::JobConflict { id } if id == held),
            "{refused}"
        );
        let after = pool.metadata().await;
        assert_eq!(after.disks.len(), before.disks.len(), "no disk added");
        assert_eq!(after.generation, before.generation, "nothing committed");
        assert_eq!(pool.status().await.disks.len(), before.disks.len());
        assert_eq!(
            terrace_engine::scan(&more.devices).await[0].kind,
            terrace_engine::DeviceKind::Blank,
            "the refused disk is untouched"
        );
        // Once the job is gone the same disk replaces the old one.
        pool.job_action(held, JobAction::Cancel).await.unwrap();
        let (new, _) = pool
            .replace_disk(old, more.new_disks().remove(0))
            .await
            .unwrap();
        with_jobs(&pool, jobs_settle(&pool)).await;
        let now = disks_of(&pool.metadata().await, "m");
        assert!(now.contains(&new) && !now.contains(&old));
    });
}

#[test]
fn jobs_pause_resume_and_cancel_without_losing_writes() {
    block_on(async {
        let disks = Disks::new(4, 16 << 20);
        let pool = create_pool(&disks).await;
        let (space, mut model) = small_mirror(&pool, 1, 9).await;
        set_repair_rate(&pool, 2 << 20).await;
        let victim = disks_of(&pool.metadata().await, "m")[0];
        let id = pool.start_evacuation(victim).await.unwrap();
        with_jobs(&pool, sleep(300)).await;
        pool.job_action(id, JobAction::Pause).await.unwrap();
        let paused = pool.job_statuses().await[0].clone();
        assert_eq!(paused.state, JobState::Paused);
        with_jobs(&pool, sleep(300)).await;
        assert_eq!(
            pool.job_statuses().await[0].bytes_done,
            paused.bytes_done,
            "a paused job does not move"
        );
        // Writes while moving reach both places; cancel keeps them.
        let data = SplitMix64::new(2).bytes(1 << 20);
        space.write(0, bytes(data.clone()), false).await.unwrap();
        model.write(0, &data);
        pool.job_action(id, JobAction::Resume).await.unwrap();
        with_jobs(&pool, sleep(200)).await;
        pool.job_action(id, JobAction::Cancel).await.unwrap();
        assert!(
            pool.job_action(id, JobAction::Resume).await.is_err(),
            "a cancelled job stays cancelled"
        );
        assert!(
            disks_of(&pool.metadata().await, "m").contains(&victim),
            "cancel leaves the disk in place"
        );
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

#[test]
fn a_returning_disk_resyncs_only_what_it_missed() {
    block_on(returning_disk_resyncs_only_what_it_missed(false));
}

/// The same with the power cut after the write: the extent is noted in the
/// intent slots, not yet in the metadata, and import finds it there.
#[test]
fn a_returning_disk_resyncs_what_it_missed_before_a_crash() {
    block_on(returning_disk_resyncs_only_what_it_missed(true));
}

async fn returning_disk_resyncs_only_what_it_missed(crash: bool) {
    let disks = Disks::new(3, 16 << 20);
    let pool = create_pool(&disks).await;
    wait_for_missing_disks(&pool).await;
    let mut config = SpaceConfig::new("m", Layout::Mirror { copies: 3 }, SpaceSize::Bytes(4 << 20));
    config.columns = Some(1);
    let space = pool.create_space(config).await.unwrap().space;
    let mut model = fill(&space, 4).await;
    pool.close().await.unwrap();
    // Disk 2 is away; one extent is written meanwhile.
    let pool = Pool::import(env(), disks.devices[..2].to_vec(), ImportOptions::default())
        .await
        .unwrap();
    let space = pool.space("m").unwrap();
    let generation = pool.metadata().await.generation;
    let data = SplitMix64::new(6).bytes(32 << 10);
    space.write(0, bytes(data.clone()), false).await.unwrap();
    model.write(0, &data);
    let metadata = pool.metadata().await;
    assert_eq!(metadata.dirty.len(), 1);
    assert_eq!(
        metadata.dirty[0].extents.len(),
        1,
        "only the extent written is dirty"
    );
    // Noted without a metadata commit, and shown.
    assert_eq!(metadata.generation, generation);
    assert_eq!(pool.status().await.disks[2].missed_extents, 1);
    if crash {
        drop(space);
        drop(pool);
        // Still away: the import finds the note in the intent slots.
        assert_eq!(dirty_found(&disks.devices[..2]).await, metadata.dirty);
    } else {
        pool.close().await.unwrap();
    }
    // It comes back: a resync of that one extent, then it is active.
    let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
        .await
        .unwrap();
    with_jobs(&pool, jobs_settle(&pool)).await;
    let metadata = pool.metadata().await;
    let job = metadata.jobs.last().unwrap();
    assert_eq!(job.kind, JobKind::Resync { disk: DiskIndex(2) });
    // Finished: its moves kept as a count, not as a record: the extent
    // written, and (closed, so its sums were written back) the extent of
    // its sums.
    let moves = if crash { 1 } else { 2 };
    assert_eq!(
        (job.moves_total(), job.moves_done(), job.moves.len()),
        (moves, moves, 0)
    );
    assert_eq!(metadata.disks[2].state, DiskState::Active);
    assert!(metadata.dirty.is_empty());
    assert_eq!(pool.status().await.disks[2].missed_extents, 0);
    let space = pool.space("m").unwrap();
    check(&space, &model).await;
    assert_redundant(&space).await;
    // A power cut now finds nothing dirty: the note the intent slots may
    // still hold predates the commit that dropped it.
    drop(space);
    drop(pool);
    let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
        .await
        .unwrap();
    assert!(pool.metadata().await.dirty.is_empty());
    // And its copy is really current: lose the other two.
    let space = pool.space("m").unwrap();
    disks.faults[0].lose();
    disks.faults[1].lose();
    check(&space, &model).await;
}

/// A disk left out of an import has its slabs repaired elsewhere at once
/// (retire-missing auto). Brought back before that repair is done, it is
/// not retired: the repair is cancelled with the reason, and the disk
/// catches up in place on what was written while it was away.
#[test]
fn a_disk_back_before_its_repair_is_done_catches_up_in_place() {
    block_on(async {
        let disks = Disks::new(5, 16 << 20);
        let pool = create_pool(&disks).await;
        let (_, mut model) = small_mirror(&pool, 2, 7).await;
        set_repair_rate(&pool, 1 << 20).await;
        let away = disks_of(&pool.metadata().await, "m")[0];
        pool.close().await.unwrap();
        let others: Vec<_> = (0..disks.devices.len())
            .filter(|&i| i != usize::from(away.0))
            .map(|i| disks.devices[i].clone())
            .collect();
        let pool = Pool::import(env(), others, ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("m").unwrap();
        let data = SplitMix64::new(8).bytes(64 << 10);
        space.write(0, bytes(data.clone()), false).await.unwrap();
        model.write(0, &data);
        with_jobs(&pool, sleep(1500)).await;
        let repair = pool.job_statuses().await;
        assert!(
            matches!(repair[..], [ref job] if job.kind == JobKind::Repair { disk: away }
                && job.state == JobState::Running && job.bytes_done > 0),
            "{repair:?}"
        );
        pool.close().await.unwrap();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let settled = with_jobs(&pool, jobs_settle(&pool)).await;
        let kinds: Vec<_> = settled.iter().map(|s| (s.kind, s.state)).collect();
        assert_eq!(
            kinds,
            vec![
                (JobKind::Repair { disk: away }, JobState::Cancelled),
                (JobKind::Resync { disk: away }, JobState::Done),
            ]
        );
        assert!(
            settled[0]
                .reason
                .contains("returned and catches up in place"),
            "{}",
            settled[0].reason
        );
        let metadata = pool.metadata().await;
        assert_eq!(metadata.disks[usize::from(away.0)].state, DiskState::Active);
        assert!(metadata.dirty.is_empty());
        let space = pool.space("m").unwrap();
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// A log copy lost with its journal disk is re-mirrored onto another
/// journal disk with room, not onto the capacity disks: there a parity
/// space's log would write at their speed from then on.
#[test]
fn a_lost_log_copy_is_re_mirrored_onto_another_journal_disk() {
    block_on(async {
        let disks = Disks::new(7, 64 << 20);
        let pool = journal_pool(small_config("tank"), &disks.devices, 4).await;
        let mut config = SpaceConfig::new(
            "p",
            Layout::Parity { redundancy: 1 },
            SpaceSize::Bytes(4 << 20),
        );
        config.cache_bytes = Some(32 << 20);
        let space = pool.create_space(config).await.unwrap().space;
        let model = fill(&space, 3).await;
        let before = log_disks(&pool.metadata().await);
        assert_eq!(
            before,
            vec![4, 5, 6],
            "the log is spread over the journal disks"
        );
        disks.faults[5].lose();
        let settled = with_jobs(&pool, jobs_settle(&pool)).await;
        assert!(
            settled
                .iter()
                .any(|s| s.kind == JobKind::Repair { disk: DiskIndex(5) }
                    && s.state == JobState::Done),
            "{settled:?}"
        );
        assert_eq!(log_disks(&pool.metadata().await), vec![4, 6]);
        let journal = space.journal().unwrap();
        assert_eq!(journal.status().write_through, None);
        check(&space, &model).await;
    });
}

#[test]
fn a_failing_target_is_replaced_and_a_second_loss_beyond_tolerance_fails_the_job() {
    block_on(async {
        // The repair goes to the hot spares: losing its target costs no
        // data (a capacity disk would also hold copies of its own, and
        // with copies spread over every disk, losing one of those too
        // would be a second loss).
        let disks = Disks::new(6, 16 << 20);
        let pool = create_pool(&disks).await;
        for spare in [4, 5] {
            pool.set_disk_usage(DiskIndex(spare), Usage::HotSpare)
                .await
                .unwrap();
        }
        let mut config =
            SpaceConfig::new("m", Layout::Mirror { copies: 2 }, SpaceSize::Bytes(4 << 20));
        config.columns = Some(1);
        config.interleave_bytes = Some(4096);
        let space = pool.create_space(config).await.unwrap().space;
        let model = fill(&space, 12).await;
        set_repair_rate(&pool, 4 << 20).await;
        let used = disks_of(&pool.metadata().await, "m");
        disks.faults[usize::from(used[0].0)].lose();
        with_jobs(&pool, async {
            sleep(300).await;
            let metadata = pool.metadata().await;
            let target = metadata.jobs[0].moves[0].target.disk;
            disks.faults[usize::from(target.0)].lose();
            jobs_settle(&pool).await;
        })
        .await;
        let metadata = pool.metadata().await;
        assert!(
            metadata.jobs.iter().any(|j| j.state == JobState::Done),
            "{:?}",
            metadata.jobs
        );
        check(&space, &model).await;
        // A second repair, during which the source of a pending move dies:
        // beyond tolerance for that extent.
        let metadata = pool.metadata().await;
        let record = metadata.space("m").unwrap().clone();
        let victim = record.extents[0].slabs.as_ref().unwrap()[0].disk;
        disks.faults[usize::from(victim.0)].lose();
        let source = with_jobs(&pool, async {
            loop {
                let metadata = pool.metadata().await;
                let pending = metadata
                    .jobs
                    .iter()
                    .filter(|j| j.is_active())
                    .flat_map(|j| j.moves.iter())
                    .find(|m| !m.done);
                if let Some(step) = pending {
                    let slabs = record.extents[step.extent as usize].slabs.as_ref().unwrap();
                    let other = slabs[1 - usize::from(step.slot)].disk;
                    disks.faults[usize::from(other.0)].lose();
                    jobs_settle(&pool).await;
                    break (step.extent, other);
                }
                sleep(5).await;
            }
        })
        .await;
        let statuses = pool.job_statuses().await;
        let failed: Vec<_> = statuses
            .iter()
            .filter(|s| s.state == JobState::Failed)
            .collect();
        assert!(!failed.is_empty(), "the repair fails: {statuses:?}");
        assert!(failed.iter().all(|s| !s.reason.is_empty()), "with a reason");
        let _ = source;
        let mut unavailable = 0;
        for block in 0..space.size_bytes() / 4096 {
            match space.read(block * 4096, 4096).await {
                Ok(read) => assert_eq!(&read[..], model.slice(block * 4096, 4096), "block {block}"),
                Err(_) => unavailable += 1,
            }
        }
        assert!(
            unavailable > 0,
            "the extents that lost both copies are unavailable"
        );
        assert!(matches!(space.health(), SpaceHealth::Offline { .. }));
    });
}

#[test]
fn health_tells_missing_from_failed_and_what_another_failure_would_cost() {
    block_on(async {
        let disks = Disks::new(5, 16 << 20);
        let pool = create_pool(&disks).await;
        wait_for_missing_disks(&pool).await;
        let mut mirror =
            SpaceConfig::new("m", Layout::Mirror { copies: 2 }, SpaceSize::Bytes(1 << 20));
        mirror.columns = Some(2);
        pool.create_space(mirror).await.unwrap();
        let mut simple = SpaceConfig::new("s", Layout::Simple, SpaceSize::Bytes(1 << 20));
        simple.columns = Some(5);
        pool.create_space(simple).await.unwrap();
        let status = pool.status().await;
        let disk0 = status.impact.iter().find(|i| i.what == "disk 0").unwrap();
        assert_eq!(disk0.lose_data, vec!["s".to_string()], "{disk0:?}");
        assert_eq!(disk0.lose_redundancy, vec!["m".to_string()], "{disk0:?}");
        pool.close().await.unwrap();
        // Disk 4 missing: the mirror is incomplete (its data intact).
        let pool = Pool::import(env(), disks.devices[..4].to_vec(), ImportOptions::default())
            .await
            .unwrap();
        let status = pool.status().await;
        let m = status.spaces.iter().find(|s| s.name == "m").unwrap();
        assert_eq!(m.health, SpaceHealth::Incomplete { survives: 0 });
        let s = status.spaces.iter().find(|s| s.name == "s").unwrap();
        assert!(matches!(s.health, SpaceHealth::Offline { .. }));
        pool.close().await.unwrap();
        // All present, disk 1 fails: degraded, then repairing while a job runs.
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        with_jobs(&pool, jobs_settle(&pool)).await;
        disks.faults[1].lose();
        let space = pool.space("m").unwrap();
        let _ = space.read(0, 1 << 20).await;
        let conditions: Vec<_> = pool
            .status()
            .await
            .disks
            .iter()
            .map(|d| (d.condition, d.state))
            .collect();
        assert_eq!(
            space.health(),
            SpaceHealth::Degraded { survives: 0 },
            "{conditions:?}"
        );
        pool.set_settings(terrace_engine::meta::PoolSettings {
            retire_missing: terrace_engine::meta::RetireMissing::Auto,
            repair_rate_bytes_per_second: 256 << 10,
            ..pool.metadata().await.settings
        })
        .await
        .unwrap();
        let seen = with_jobs(&pool, async {
            for _ in 0..400 {
                let status = pool.status().await;
                let m = status
                    .spaces
                    .iter()
                    .find(|s| s.name == "m")
                    .unwrap()
                    .health
                    .clone();
                if matches!(m, SpaceHealth::Repairing { .. }) {
                    return Some(m);
                }
                sleep(5).await;
            }
            None
        })
        .await;
        assert!(
            matches!(seen, Some(SpaceHealth::Repairing { survives: 0, .. })),
            "{seen:?}"
        );
    });
}

/// A finished job keeps the rate it ran at: asked later, it is the same
/// (it used to be its bytes over the time since it started, so it decayed
/// as time passed after the job ended).
#[test]
fn a_finished_job_keeps_its_rate() {
    block_on(async {
        let disks = Disks::new(5, 16 << 20);
        let pool = create_pool(&disks).await;
        let mut config =
            SpaceConfig::new("m", Layout::Mirror { copies: 2 }, SpaceSize::Bytes(4 << 20));
        config.columns = Some(2);
        let space = pool.create_space(config).await.unwrap().space;
        let model = fill(&space, 9).await;
        let lost = disks_of(&pool.metadata().await, "m")[0];
        disks.faults[usize::from(lost.0)].lose();
        let done = with_jobs(&pool, jobs_settle(&pool)).await;
        let repair = |statuses: &[terrace_engine::JobStatus]| {
            statuses
                .iter()
                .find(|s| s.kind == JobKind::Repair { disk: lost })
                .cloned()
                .expect("a repair of the lost disk")
        };
        let first = repair(&done);
        assert_eq!(first.state, JobState::Done, "{first:?}");
        assert!(first.rate_bytes_per_second > 0, "{first:?}");
        assert_eq!(first.eta_seconds, None, "{first:?}");
        sleep(300).await;
        let later = repair(&pool.job_statuses().await);
        assert_eq!(later.rate_bytes_per_second, first.rate_bytes_per_second);
        check(&space, &model).await;
    });
}

/// What each disk's failure would cost is listed in disk order: disk 2
/// before disk 10 (the names sorted as text put 10 after 1).
#[test]
fn failure_impacts_are_listed_in_disk_order() {
    block_on(async {
        let disks = Disks::new(12, 16 << 20);
        let pool = create_pool(&disks).await;
        let status = pool.status().await;
        let listed: Vec<&str> = status.impact.iter().map(|i| i.what.as_str()).collect();
        let expected: Vec<String> = (0..12).map(|disk| format!("disk {disk}")).collect();
        assert_eq!(listed, expected);
        pool.close().await.unwrap();
    });
}

/// What a journal disk's failure would cost is listed too: the logs on it
/// left with one copy, then, with one copy already gone, a log losing
/// every copy (its space writes through from then on).
#[test]
fn failure_impacts_name_the_write_back_logs_a_disk_holds() {
    block_on(async {
        let disks = Disks::new(6, 64 << 20);
        let pool = journal_pool(small_config("tank"), &disks.devices, 4).await;
        wait_for_missing_disks(&pool).await;
        let mut config = SpaceConfig::new(
            "p",
            Layout::Parity { redundancy: 1 },
            SpaceSize::Bytes(2 << 20),
        );
        config.cache_bytes = Some(32 << 20);
        let space = pool.create_space(config).await.unwrap().space;
        let impact = |status: &terrace_engine::PoolStatus, disk: &str| {
            let found = status.impact.iter().find(|i| i.what == disk).unwrap();
            (
                found.lose_data.clone(),
                found.lose_redundancy.clone(),
                found.lose_log.clone(),
                found.lose_log_redundancy.clone(),
            )
        };
        let none: Vec<String> = Vec::new();
        let p = vec!["p".to_string()];
        let status = pool.status().await;
        for disk in ["disk 4", "disk 5"] {
            assert_eq!(
                impact(&status, disk),
                (none.clone(), none.clone(), none.clone(), p.clone())
            );
        }
        assert_eq!(
            impact(&status, "disk 0"),
            (none.clone(), p.clone(), none.clone(), none.clone())
        );
        disks.faults[4].lose();
        space.write(0, bytes(vec![7; 4096]), false).await.unwrap();
        let status = pool.status().await;
        assert_eq!(
            impact(&status, "disk 5"),
            (none.clone(), none.clone(), p.clone(), none.clone())
        );
    });
}

/// The disks holding the write-back logs of `metadata`'s spaces.
fn log_disks(metadata: &terrace_engine::meta::PoolMetadata) -> Vec<usize> {
    let mut disks: Vec<usize> = metadata
        .spaces
        .iter()
        .filter(|s| matches!(s.role, SpaceRole::Log { .. }))
        .flat_map(|s| s.extents.iter())
        .flat_map(|e| {
            e.slabs
                .iter()
                .flatten()
                .map(|slab| usize::from(slab.disk.0))
        })
        .collect();
    disks.sort_unstable();
    disks.dedup();
    disks
}

/// A pool of the first four of `disks`, with a 2 MiB parity space "p"
/// filled from `seed` whose write-back log of `cache_bytes` sits on those
/// capacity disks; moves limited to 4 MiB/s.
async fn parity_log_on_capacity(
    disks: &Disks,
    cache_bytes: u64,
    seed: u64,
) -> (Pool, Arc<Space>, Model) {
    let mut capacity = disks.new_disks();
    capacity.truncate(4);
    let pool = Pool::create(env(), small_config("tank"), capacity)
        .await
        .unwrap();
    let mut config = SpaceConfig::new(
        "p",
        Layout::Parity { redundancy: 1 },
        SpaceSize::Bytes(2 << 20),
    );
    config.cache_bytes = Some(cache_bytes);
    let space = pool.create_space(config).await.unwrap().space;
    let model = fill(&space, seed).await;
    set_repair_rate(&pool, 4 << 20).await;
    (pool, space, model)
}

/// Add the disks of `disks` past the fourth to `pool` as journal disks.
async fn add_journal_disks(pool: &Pool, disks: &Disks) {
    let journal = journal_disks_after(&disks.devices[4..], 0);
    pool.add_disks(journal).await.unwrap();
}

/// Journal disks added to a pool whose parity log sits on its capacity
/// disks take the log over (a job), while it is written; a repair of a
/// disk the job is moving a log slot off waits for it; the log recovers
/// from a crash halfway and from a restart after the move.
#[test]
fn journal_disks_added_later_take_over_the_logs() {
    block_on(async {
        let disks = Disks::new(6, 64 << 20);
        let (pool, space, mut model) = parity_log_on_capacity(&disks, 32 << 20, 11).await;
        let on_capacity = log_disks(&pool.metadata().await);
        assert!(on_capacity.iter().all(|&d| d < 4), "{on_capacity:?}");
        add_journal_disks(&pool, &disks).await;
        let mut rng = SplitMix64::new(12);
        let job = with_jobs(&pool, async {
            for _ in 0..40 {
                let (offset, length) = random_range(&mut rng, space.size_bytes(), 8 << 10);
                model.write_random(&space, &mut rng, offset, length).await;
                sleep(5).await;
            }
            pool.job_statuses().await
        })
        .await;
        let moving = job
            .iter()
            .find(|s| s.kind == JobKind::LogsToJournal)
            .expect("a job moving the log");
        assert_eq!(moving.state, JobState::Running, "{moving:?}");
        pool.job_action(moving.id, JobAction::Pause).await.unwrap();
        let source = on_capacity[0];
        assert!(
            matches!(
                pool.start_repair(DiskIndex(source as u16)).await,
                Err(EngineError::JobConflict { id }) if id == moving.id
            ),
            "a repair of disk {source} would move the slot the job moves"
        );
        // More writes into the half-moved log, then a crash (no close):
        // the log recovers from its slots, some at their new homes.
        model
            .write_random_ranges(&space, &mut rng, 20, 8 << 10)
            .await;
        drop(space);
        drop(pool);
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("p").unwrap();
        check(&space, &model).await;
        pool.job_action(moving.id, JobAction::Resume).await.unwrap();
        set_repair_rate(&pool, 0).await;
        let settled = with_jobs(&pool, jobs_settle(&pool)).await;
        assert_eq!(
            settled
                .iter()
                .map(|s| (s.kind, s.state))
                .collect::<Vec<_>>(),
            vec![(JobKind::LogsToJournal, JobState::Done)]
        );
        assert_eq!(log_disks(&pool.metadata().await), vec![4, 5]);
        check(&space, &model).await;
        drop(space);
        drop(pool);
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("p").unwrap();
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// A disk that went missing while the pool runs is taken back while it
/// runs: the repair the policy started is cancelled, writes made while it
/// was away reach it through a resync of their extents, writes go on
/// throughout, and its copies agree with the others at the end.
#[test]
fn a_missing_disk_is_taken_back_while_the_pool_runs() {
    block_on(async {
        let disks = Disks::new(5, 16 << 20);
        let pool = create_pool(&disks).await;
        let (space, mut model) = small_mirror(&pool, 2, 21).await;
        set_repair_rate(&pool, 1 << 20).await;
        let away = disks_of(&pool.metadata().await, "m")[0];
        pool.disk_gone(away, "pulled").await.unwrap();
        // A write into an extent it holds, while it is away (the last: the
        // repair below moves its first ones off it).
        let metadata = pool.metadata().await;
        let held = metadata
            .space("m")
            .unwrap()
            .extents
            .iter()
            .rposition(|e| e.slabs.as_ref().unwrap().iter().any(|s| s.disk == away))
            .unwrap() as u64;
        let offset = held * space.geometry().extent_data_bytes();
        let mut rng = SplitMix64::new(22);
        let data = rng.bytes(64 << 10);
        space
            .write(offset, bytes(data.clone()), false)
            .await
            .unwrap();
        model.write(offset, &data);
        with_jobs(&pool, sleep(300)).await;
        let repair = pool.job_statuses().await;
        assert!(
            matches!(repair[..], [ref job] if job.kind == JobKind::Repair { disk: away }
                && job.state == JobState::Running),
            "{repair:?}"
        );
        let blank = Disks::new(1, 16 << 20);
        assert!(matches!(
            pool.bring_back(blank.devices[0].clone()).await,
            Err(EngineError::NotReturning { .. })
        ));
        let (index, _) = pool
            .bring_back(disks.devices[usize::from(away.0)].clone())
            .await
            .unwrap();
        assert_eq!(index, away);
        let refused = pool
            .bring_back(disks.devices[usize::from(away.0)].clone())
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains("is in service"), "{refused}");
        set_repair_rate(&pool, 0).await;
        let settled = with_jobs(&pool, async {
            model
                .write_random_ranges(&space, &mut rng, 20, 16 << 10)
                .await;
            jobs_settle(&pool).await
        })
        .await;
        let kinds: Vec<_> = settled.iter().map(|s| (s.kind, s.state)).collect();
        assert_eq!(
            kinds,
            vec![
                (JobKind::Repair { disk: away }, JobState::Cancelled),
                (JobKind::Resync { disk: away }, JobState::Done),
            ]
        );
        assert_eq!(settled[1].moves_total, 1, "the slot written, in place");
        let metadata = pool.metadata().await;
        assert_eq!(metadata.disks[usize::from(away.0)].state, DiskState::Active);
        assert!(metadata.dirty.is_empty());
        check(&space, &model).await;
        assert_redundant(&space).await;
        // Gone again and back with nothing written meanwhile: in service
        // at once, and recorded so.
        pool.disk_gone(away, "pulled again").await.unwrap();
        pool.bring_back(disks.devices[usize::from(away.0)].clone())
            .await
            .unwrap();
        let record = &pool.metadata().await.disks[usize::from(away.0)];
        assert_eq!(record.state, DiskState::Active, "{record:?}");
        pool.close().await.unwrap();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("m").unwrap();
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// A disk replaced while it was missing and present again at the next
/// import: the import goes on (the replacement's job works on the disk, so
/// it cannot catch up), the disk stays out of service, the replacement
/// finishes and releases it.
#[test]
fn a_disk_replaced_while_missing_and_back_at_an_import_stays_out() {
    block_on(async {
        let disks = Disks::new(5, 16 << 20);
        let mut members = disks.new_disks();
        let spare = members.pop().unwrap();
        let pool = Pool::create(env(), small_config("tank"), members)
            .await
            .unwrap();
        let (space, mut model) = small_mirror(&pool, 2, 31).await;
        let away = disks_of(&pool.metadata().await, "m")[0];
        pool.disk_gone(away, "pulled").await.unwrap();
        let data = SplitMix64::new(32).bytes(64 << 10);
        space.write(0, bytes(data.clone()), false).await.unwrap();
        model.write(0, &data);
        let (new, job) = pool.replace_disk(away, spare).await.unwrap();
        drop(space);
        pool.close().await.unwrap();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let disk = |status: &terrace_engine::PoolStatus, index: DiskIndex| {
            let disk = &status.disks[usize::from(index.0)];
            (disk.condition, disk.reason.clone())
        };
        let (condition, reason) = disk(&pool.status().await, away);
        assert_eq!(condition, terrace_engine::Condition::Standby, "{reason}");
        assert!(reason.contains("present but stale"), "{reason}");
        let statuses = pool.job_statuses().await;
        assert!(
            matches!(statuses[..], [ref s] if s.id == job && s.state == JobState::Running),
            "the replacement goes on, and no resync starts: {statuses:?}"
        );
        let space = pool.space("m").unwrap();
        check(&space, &model).await;
        let settled = with_jobs(&pool, jobs_settle(&pool)).await;
        let kinds: Vec<_> = settled.iter().map(|s| (s.kind, s.state)).collect();
        assert_eq!(
            kinds,
            vec![(JobKind::Replace { old: away, new }, JobState::Done)]
        );
        let metadata = pool.metadata().await;
        assert_eq!(
            metadata.disks[usize::from(away.0)].state,
            DiskState::Removed
        );
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// Add the journal disks of `disks` to `pool` and let the job runner start
/// moving the log onto them; the log move's job id.
async fn log_move_started(pool: &Pool, disks: &Disks) -> u64 {
    add_journal_disks(pool, disks).await;
    let statuses = with_jobs(pool, async {
        sleep(50).await;
        pool.job_statuses().await
    })
    .await;
    statuses
        .iter()
        .find(|s| s.kind == JobKind::LogsToJournal && s.state == JobState::Running)
        .unwrap_or_else(|| panic!("a log move runs: {statuses:?}"))
        .id
}

/// A finished job keeps counts of its moves, not their records: a log move
/// cancelled with 1,024 moves leaves room in the 64 KiB metadata slot for
/// the next one, which runs (with the records kept, it could not be
/// recorded and failed).
#[test]
fn a_cancelled_job_leaves_room_for_the_next() {
    block_on(async {
        let disks = Disks::new(6, 64 << 20);
        let (pool, _space, _model) = parity_log_on_capacity(&disks, 32 << 20, 35).await;
        let moving = log_move_started(&pool, &disks).await;
        pool.job_action(moving, JobAction::Cancel).await.unwrap();
        let statuses = jobs_recorded(&pool, 2).await;
        let (first, second) = (&statuses[0], &statuses[1]);
        assert_eq!(first.state, JobState::Cancelled, "{statuses:?}");
        assert!(first.moves_total >= 1024, "{statuses:?}");
        assert_eq!(
            (second.kind, second.state),
            (JobKind::LogsToJournal, JobState::Running),
            "{statuses:?}"
        );
        let metadata = pool.metadata().await;
        assert!(metadata.jobs[0].moves.is_empty(), "{:?}", metadata.jobs[0]);
    });
}

/// The job statuses once `count` jobs have been recorded.
async fn jobs_recorded(pool: &Pool, count: usize) -> Vec<terrace_engine::JobStatus> {
    with_jobs(pool, async {
        for _ in 0..100 {
            let statuses = pool.job_statuses().await;
            if statuses.len() >= count {
                return statuses;
            }
            sleep(5).await;
        }
        panic!("not {count} jobs: {:?}", pool.job_statuses().await);
    })
    .await
}

/// A log move whose record does not fit the pool's metadata (small slabs
/// and a large log: 2,048 moves for a 64 KiB slot) fails where `job list`
/// shows it, with the reason, instead of never starting.
#[test]
fn a_log_move_that_cannot_be_recorded_fails_with_its_reason() {
    block_on(async {
        let disks = Disks::new(6, 96 << 20);
        let (pool, _space, _model) = parity_log_on_capacity(&disks, 64 << 20, 35).await;
        add_journal_disks(&pool, &disks).await;
        let statuses = jobs_recorded(&pool, 1).await;
        assert_eq!(
            (statuses[0].kind, statuses[0].state),
            (JobKind::LogsToJournal, JobState::Failed),
            "{statuses:?}"
        );
        assert!(
            statuses[0].reason.contains("does not fit"),
            "{}",
            statuses[0].reason
        );
    });
}

/// A pool whose parity log is moving onto journal disks added later (the
/// move paused), and the capacity disk it takes a log slot off, gone and
/// written around since.
async fn log_move_under_way(disks: &Disks) -> (Pool, Model, DiskIndex, u64) {
    // A small log: few moves in the job records the metadata keeps.
    let (pool, space, mut model) = parity_log_on_capacity(disks, 4 << 20, 33).await;
    let moving = log_move_started(&pool, disks).await;
    pool.job_action(moving, JobAction::Pause).await.unwrap();
    let metadata = pool.metadata().await;
    let job = metadata.jobs.iter().find(|job| job.id == moving).unwrap();
    let step = job.moves.iter().find(|step| !step.done).unwrap();
    let log = metadata.spaces.iter().find(|s| s.id == step.space).unwrap();
    let source =
        log.extents[step.extent as usize].slabs.as_ref().unwrap()[usize::from(step.slot)].disk;
    pool.disk_gone(source, "pulled").await.unwrap();
    let mut rng = SplitMix64::new(34);
    model
        .write_random_ranges(&space, &mut rng, 20, 8 << 10)
        .await;
    (pool, model, source, moving)
}

/// A disk that a log move takes a slot off comes back: the move is
/// cancelled for it (the disk's catch-up and the move would share the
/// slot), at an import and while the pool runs alike, and starts again
/// once the disk has caught up; the log ends on the journal disks.
#[test]
fn a_returning_disk_cancels_a_log_move_off_it_which_starts_again_after() {
    for live in [false, true] {
        block_on(async {
            let disks = Disks::new(6, 64 << 20);
            let (pool, model, source, moving) = log_move_under_way(&disks).await;
            let pool = if live {
                pool.bring_back(disks.devices[usize::from(source.0)].clone())
                    .await
                    .unwrap();
                pool
            } else {
                drop(pool);
                Pool::import(env(), disks.devices.clone(), ImportOptions::default())
                    .await
                    .unwrap()
            };
            let statuses = pool.job_statuses().await;
            let cancelled = statuses.iter().find(|s| s.id == moving).unwrap();
            assert_eq!(cancelled.state, JobState::Cancelled, "{statuses:?}");
            let because = format!("disk {} returned and catches up first", source.0);
            let first = JobKind::Resync { disk: source };
            log_move_ends_after(&pool, &model, moving, first, &because).await;
        });
    }
}

/// Run the jobs until the log move `moving`, cancelled `because` of the
/// job `first` (done by then), has started again and ended; then the log
/// is on the journal disks and the data reads back, fully redundant.
async fn log_move_ends_after(
    pool: &Pool,
    model: &Model,
    moving: u64,
    first: JobKind,
    because: &str,
) {
    set_repair_rate(pool, 0).await;
    let settled = with_jobs(pool, async {
        // The move starts again once the pool's disks change.
        for _ in 0..100 {
            let settled = jobs_settle(pool).await;
            if settled.len() >= 3 {
                return settled;
            }
            sleep(5).await;
        }
        panic!("the log move did not start again");
    })
    .await;
    let cancelled = settled.iter().find(|s| s.id == moving).unwrap();
    assert!(cancelled.reason.contains(because), "{}", cancelled.reason);
    let kinds: Vec<_> = settled.iter().map(|s| (s.kind, s.state)).collect();
    assert_eq!(
        kinds,
        vec![
            (JobKind::LogsToJournal, JobState::Cancelled),
            (first, JobState::Done),
            (JobKind::LogsToJournal, JobState::Done),
        ]
    );
    assert_eq!(log_disks(&pool.metadata().await), vec![4, 5]);
    let space = pool.space("p").unwrap();
    check(&space, model).await;
    assert_redundant(&space).await;
}

/// A disk that a log move takes a slot off is lost: its repair does not
/// wait for the move. Started by the policy or by hand, the repair cancels
/// the move in its own commit, and the move starts again after it; the log
/// ends on the journal disks and every write reads back.
#[test]
fn a_lost_disk_s_repair_cancels_a_log_move_off_it_which_starts_again_after() {
    for by_hand in [false, true] {
        block_on(async {
            let disks = Disks::new(6, 64 << 20);
            let (pool, model, source, moving) = log_move_under_way(&disks).await;
            if by_hand {
                pool.start_repair(source).await.unwrap();
            }
            let because = format!("for the repair of disk {}", source.0);
            let first = JobKind::Repair { disk: source };
            log_move_ends_after(&pool, &model, moving, first, &because).await;
        });
    }
}

/// Spaces are refused once the metadata after them would leave no room to
/// record the repair of the fullest disk (a 64 KiB slot, 64 KiB slabs),
/// changing nothing; what was allocated up to then is repaired when that
/// disk is lost, the repair's record fitting beside everything else.
#[test]
fn allocations_keep_room_in_the_metadata_for_a_repair() {
    block_on(async {
        let disks = Disks::new(5, 128 << 20);
        let pool = create_pool(&disks).await;
        let mirror = |name: String| {
            let mut config = SpaceConfig::new(
                &name,
                Layout::Mirror { copies: 2 },
                SpaceSize::Bytes(16 << 20),
            );
            config.columns = Some(1);
            config
        };
        let mut made = 0;
        let refusal = loop {
            match pool.create_space(mirror(format!("m{made}"))).await {
                Ok(_) => made += 1,
                Err(error) => break error,
            }
            assert!(made < 40, "never refused");
        };
        assert!(
            matches!(refusal, EngineError::MetadataRoom { .. }),
            "{refusal}"
        );
        assert!(made >= 2, "{made} spaces");
        let before = pool.metadata().await;
        let status = pool.status().await;
        assert!(
            status.metadata_bytes + status.metadata_reserve_bytes <= status.metadata_slot_bytes,
            "{} + {} > {}",
            status.metadata_bytes,
            status.metadata_reserve_bytes,
            status.metadata_slot_bytes
        );
        // The disks have room for another such space (32 MiB of slabs), the
        // metadata does not.
        let free = status.capacity_bytes - status.allocated_bytes;
        assert!(free > 2 * (32 << 20), "{free} bytes free");
        assert!(pool.create_space(mirror("again".into())).await.is_err());
        let after = pool.metadata().await;
        assert_eq!(
            (after.generation, &after.spaces),
            (before.generation, &before.spaces)
        );

        let space = pool.space("m0").unwrap();
        let model = fill(&space, 41).await;
        let metadata = pool.metadata().await;
        let fullest = (0..5u16)
            .map(DiskIndex)
            .max_by_key(|disk| {
                metadata
                    .used_slabs()
                    .iter()
                    .filter(|slab| slab.disk == *disk)
                    .count()
            })
            .unwrap();
        disks.faults[usize::from(fullest.0)].lose();
        for name in (0..made).map(|n| format!("m{n}")) {
            let space = pool.space(&name).unwrap();
            let data = space.read(0, 64 << 10).await.unwrap();
            space.write(0, data.freeze(), false).await.unwrap();
        }
        with_jobs(&pool, async {
            let statuses = jobs_settle(&pool).await;
            assert!(
                statuses
                    .iter()
                    .any(|s| s.kind == JobKind::Repair { disk: fullest }
                        && s.state == JobState::Done),
                "{statuses:?}"
            );
        })
        .await;
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// A disk that comes back holding older metadata than it had when it left
/// (an older copy of it, such as a restored image) is not taken back, live
/// or at an import: it stays missing, with the reason, and the space reads
/// from its other copies. The disk as it left is taken back.
#[test]
fn an_older_copy_of_a_missing_disk_is_not_taken_back() {
    block_on(async {
        let disks = Disks::new(3, 16 << 20);
        let pool = create_pool(&disks).await;
        wait_for_missing_disks(&pool).await;
        let (space, mut model) = small_mirror(&pool, 1, 31).await;
        let away = disks_of(&pool.metadata().await, "m")[0];
        let memory = &disks.memory[usize::from(away.0)];
        let image = memory.snapshot();
        // Commits the disk takes part in, then writes it has.
        for name in ["t0", "t1", "t2"] {
            let config = SpaceConfig::new(name, Layout::Simple, SpaceSize::Bytes(1 << 20));
            pool.create_space(config).await.unwrap();
            pool.delete_space(name).await.unwrap();
        }
        let mut rng = SplitMix64::new(32);
        model
            .write_random_ranges(&space, &mut rng, 10, 16 << 10)
            .await;
        space.flush().await.unwrap();
        pool.disk_gone(away, "pulled").await.unwrap();
        model
            .write_random_ranges(&space, &mut rng, 10, 16 << 10)
            .await;
        let as_it_left = memory.snapshot();
        memory.write_sync(0, &image);
        let refused = pool
            .bring_back(disks.devices[usize::from(away.0)].clone())
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains("an older copy"), "{refused}");
        check(&space, &model).await;

        pool.close().await.unwrap();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let status = pool.status().await;
        let disk = &status.disks[usize::from(away.0)];
        assert!(
            disk.condition == terrace_engine::Condition::Missing
                && disk.reason.contains("an older copy"),
            "{disk:?}"
        );
        let space = pool.space("m").unwrap();
        check(&space, &model).await;

        // Its label readable, its metadata slots not: it cannot be dated.
        memory.write_sync(0, &as_it_left);
        memory.write_sync(1 << 20, &vec![0u8; 2 * (64 << 10)]);
        let refused = pool
            .bring_back(disks.devices[usize::from(away.0)].clone())
            .await
            .unwrap_err()
            .to_string();
        assert!(refused.contains("could not be read"), "{refused}");

        memory.write_sync(0, &as_it_left);
        pool.bring_back(disks.devices[usize::from(away.0)].clone())
            .await
            .unwrap();
        with_jobs(&pool, jobs_settle(&pool)).await;
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// Moves that finish while a commit is under way are named together in the
/// next one: with disks whose flushes are slow (so each commit takes a
/// while, as a large pool's metadata does), repairing a disk of many slabs
/// takes far fewer commits than it has moves, and loses nothing.
#[test]
fn moves_finished_together_share_a_commit() {
    block_on(async {
        let disks = Disks::new(5, 2 * DISK_BYTES);
        let flush = DelayPolicy {
            flush_ns: 50_000_000,
            ..DelayPolicy::default()
        };
        let slow: Vec<Arc<dyn terrace_engine::io::BlockDevice>> = disks
            .devices
            .iter()
            .map(|device| Arc::new(DelayDevice::new(device.clone(), env(), flush)) as _)
            .collect();
        let pool = pool_on(small_config("tank"), &slow).await;
        let mut config =
            SpaceConfig::new("m", Layout::Mirror { copies: 2 }, SpaceSize::Bytes(4 << 20));
        config.columns = Some(1);
        let space = pool.create_space(config).await.unwrap().space;
        let model = fill(&space, 11).await;
        let lost = disks_of(&pool.metadata().await, "m")[0];
        let before = pool.metadata().await.generation;
        disks.faults[usize::from(lost.0)].lose();
        let statuses = with_jobs(&pool, async {
            // The loss is noticed at the first write that fails.
            space
                .write(0, bytes(model.slice(0, 4096).to_vec()), false)
                .await
                .unwrap();
            jobs_settle(&pool).await
        })
        .await;
        let commits = pool.metadata().await.generation - before;
        let moves: usize = statuses.iter().map(|s| s.moves_total).sum();
        assert!(moves >= 8, "{moves} moves: {statuses:?}");
        assert!(
            statuses.iter().all(|s| s.state == JobState::Done),
            "{statuses:?}"
        );
        assert!(
            commits * 2 <= moves as u64,
            "{commits} commits for {moves} moves"
        );
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// A client write still reaching a move's target when the move is
/// cancelled never lands in a space created after: the target's slab stays
/// out of allocations until the write is done, and is taken again after.
#[test]
fn a_cancelled_move_s_target_waits_for_the_writes_reaching_it() {
    use futures::task::LocalSpawnExt;
    use std::cell::Cell;
    use std::rc::Rc;

    let disks = Disks::new(5, 16 << 20);
    let gates: Vec<Arc<Gate>> = disks.devices.iter().map(|_| Arc::default()).collect();
    let devices = marked_held(&disks.devices, |index| gates[index].clone());
    let mut executor = Executor::new();
    let spawner = executor.spawner();
    let (pool, space, job, step) = executor.run_until(async {
        // 1 MiB slabs: a move copies 64 of its 256 rows a step.
        let config = PoolConfig {
            slab_bytes: 1 << 20,
            ..small_config("tank")
        };
        let pool = pool_on(config, &devices).await;
        let (space, _) = small_mirror(&pool, 1, 41).await;
        set_repair_rate(&pool, 1 << 20).await;
        let job = pool
            .start_evacuation(disks_of(&pool.metadata().await, "m")[0])
            .await
            .unwrap();
        // Run the evacuation until a move has copied some rows, not all.
        for _ in 0..200 {
            with_jobs(&pool, sleep(5)).await;
            pool.job_action(job, JobAction::Pause).await.unwrap();
            let metadata = pool.metadata().await;
            let record = metadata.jobs.iter().find(|j| j.id == job).unwrap();
            if let Some(step) = record
                .moves
                .iter()
                .find(|step| !step.done && step.watermark_rows > 0)
            {
                return (Rc::new(pool), space, job, step.clone());
            }
            pool.job_action(job, JobAction::Resume).await.unwrap();
        }
        panic!("no move copied a row");
    });

    // A write of the move's first row goes to its target too; held there.
    let target = usize::from(step.target.disk.0);
    gates[target].arm();
    let mut data = MARK.to_vec();
    data.resize(4096, 7);
    let offset = u64::from(step.extent) * space.geometry().extent_data_bytes();
    let done = Rc::new(Cell::new(false));
    let (writing, finished) = (space.clone(), done.clone());
    spawner
        .spawn_local(async move {
            writing.write(offset, bytes(data), false).await.unwrap();
            finished.set(true);
        })
        .unwrap();
    executor.run_until_stalled();
    assert!(gates[target].holding(), "the write reaches the target");

    let whole = |name: &str| {
        let mut config = SpaceConfig::new(name, Layout::Mirror { copies: 2 }, SpaceSize::Max);
        config.columns = Some(1);
        config
    };
    let after = executor.run_until(async {
        pool.job_action(job, JobAction::Cancel).await.unwrap();
        let after = pool.create_space(whole("n")).await.unwrap().space;
        let taken = space_slabs(&pool.metadata().await, "n");
        assert!(!taken.contains(&step.target), "the target was handed out");
        after
    });
    gates[target].release();
    executor.run_until_stalled();
    assert!(done.get());

    executor.run_until(async {
        let read = after.read(0, after.size_bytes()).await.unwrap();
        assert!(read.iter().all(|&byte| byte == 0), "n took m's late write");
        // A copy reads do not reach would hold it as well.
        assert_redundant(&after).await;
        // Nothing holds the target any more: the next space (a simple one
        // takes every free slab) or its sums space has it.
        let mut rest = SpaceConfig::new("o", Layout::Simple, SpaceSize::Max);
        rest.columns = Some(1);
        pool.create_space(rest).await.unwrap();
        let metadata = pool.metadata().await;
        let held = metadata
            .spaces
            .iter()
            .flat_map(|space| space.extents.iter())
            .filter_map(|extent| extent.slabs.as_ref())
            .any(|slabs| slabs.contains(&step.target));
        assert!(held, "{:?} stays out of allocations", step.target);
    });
}

/// A single-parity space of 8 extents (128 KiB of data each, one row) on
/// three disks, filled from `seed`.
async fn parity_on_three(pool: &Pool, seed: u64) -> (Arc<Space>, Model) {
    let config = SpaceConfig::new(
        "p",
        Layout::Parity { redundancy: 1 },
        SpaceSize::Bytes(1 << 20),
    );
    let space = pool.create_space(config).await.unwrap().space;
    let model = fill(&space, seed).await;
    (space, model)
}

const PARITY_EXTENT_BYTES: u64 = 2 * SLAB;

/// Lose disk `disk` under a write of a whole extent (every column is
/// written, so the disk's write fails): the write completes degraded.
async fn fail_under_write(
    pool: &Pool,
    disks: &Disks,
    space: &Space,
    model: &mut Model,
    disk: usize,
    extent: u64,
) {
    disks.faults[disk].lose();
    let mut rng = SplitMix64::new(100 + extent);
    let offset = extent * PARITY_EXTENT_BYTES;
    model
        .write_random(space, &mut rng, offset, PARITY_EXTENT_BYTES)
        .await;
    let state = pool.metadata().await.disks[disk].state;
    assert_eq!(state, DiskState::Failed, "disk {disk}");
}

/// Two of three disks of a single-parity space fail (one under a write,
/// one under a read) and the space goes offline; the faults pass. `clear`
/// takes both back: the first catches up on the extents written since it
/// failed, the second missed nothing, and every byte reads back as written
/// with redundancy whole. Repairs that could re-create nothing meanwhile
/// say so instead of passing for done.
#[test]
fn a_double_failure_that_passes_is_cleared_and_every_byte_reads_back() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let (space, mut model) = parity_on_three(&pool, 11).await;
        fail_under_write(&pool, &disks, &space, &mut model, 1, 0).await;
        let mut rng = SplitMix64::new(12);
        for extent in [2, 5] {
            let offset = extent * PARITY_EXTENT_BYTES + 4096;
            model.write_random(&space, &mut rng, offset, 8192).await;
        }
        disks.faults[2].lose();
        assert!(space.read(0, space.size_bytes()).await.is_err());
        assert_eq!(pool.metadata().await.disks[2].state, DiskState::Failed);
        let refused = space.write(0, bytes(vec![7; 4096]), false).await;
        assert!(refused.is_err(), "beyond tolerance");
        // The policy's repairs find every extent lost beyond tolerance.
        with_jobs(&pool, sleep(50)).await;
        let repairs = pool.job_statuses().await;
        assert!(!repairs.is_empty());
        for job in &repairs {
            if job.reason.contains("(its block sums)") {
                // The sums' other copy is on the one disk left: no room.
                assert_eq!(
                    (job.state, job.moves_total),
                    (JobState::Failed, 0),
                    "{job:?}"
                );
                continue;
            }
            assert_eq!((job.state, job.moves_total), (JobState::Done, 0), "{job:?}");
            assert!(job.reason.starts_with("nothing to repair"), "{job:?}");
            assert!(job.waits_for_lost_disks(), "{job:?}");
            assert!(
                !job.reason.contains("terrace"),
                "the engine names no command"
            );
        }
        disks.faults[1].restore();
        disks.faults[2].restore();
        let cleared = pool.clear(None).await.unwrap();
        let of = |disk: u16| {
            let entry = cleared.iter().find(|c| c.disk == DiskIndex(disk)).unwrap();
            assert_eq!(entry.refused, None, "{entry:?}");
            assert_eq!(entry.spaces.len(), 1, "{entry:?}");
            entry.spaces[0].clone()
        };
        assert_eq!(cleared.len(), 2, "{cleared:?}");
        assert_eq!(of(1).missed_extents, 3, "extents 0, 2 and 5");
        assert_eq!(of(2).missed_extents, 0);
        assert!(of(1).uncertain_extents.is_empty() && of(2).uncertain_extents.is_empty());
        let settled = with_jobs(&pool, jobs_settle(&pool)).await;
        assert!(settled
            .iter()
            .all(|job| job.state == JobState::Done || job.reason.contains("(its block sums)")));
        let metadata = pool.metadata().await;
        assert!(metadata.disks.iter().all(|d| d.state == DiskState::Active));
        assert!(metadata.dirty.is_empty());
        check(&space, &model).await;
        assert_redundant(&space).await;
        assert_eq!(pool.status().await.spaces[0].health, SpaceHealth::Healthy);
        // Disk 1 is current: without disk 0, it and disk 2 give it all.
        disks.faults[0].lose();
        check(&space, &model).await;
    });
}

/// A disk that still fails stays failed, and says so; a disk in service is
/// not one to clear; once the fault passes, it is taken back.
/// A disk whose device is not there is not one to clear: the refusal
/// says so with the reason it left, in the engine's words (which command
/// would help is the CLI's to say).
#[test]
fn a_disk_not_present_is_not_cleared_and_the_refusal_keeps_its_reason() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        wait_for_missing_disks(&pool).await;
        pool.close().await.unwrap();
        let present = vec![disks.devices[0].clone(), disks.devices[2].clone()];
        let pool = Pool::import(env(), present, ImportOptions::default())
            .await
            .unwrap();
        let refused = pool.clear(Some(DiskIndex(1))).await.unwrap_err();
        let EngineError::NotCleared {
            why: ClearRefusal::NotPresent { reason },
            ..
        } = &refused
        else {
            panic!("expected the disk not present: {refused}");
        };
        assert!(!reason.is_empty());
        let text = refused.to_string();
        assert!(text.ends_with("): plug it back in"), "{text}");
        assert!(
            !text.contains("terrace"),
            "the engine names no command: {text}"
        );
    })
}

#[test]
fn a_disk_that_still_fails_is_not_taken_back() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        wait_for_missing_disks(&pool).await;
        let (space, mut model) = parity_on_three(&pool, 21).await;
        fail_under_write(&pool, &disks, &space, &mut model, 1, 3).await;
        let cleared = pool.clear(None).await.unwrap();
        assert_eq!(cleared.len(), 1);
        let why = cleared[0].refused.clone().unwrap_or_default();
        assert!(why.contains("still fails"), "{cleared:?}");
        assert_eq!(cleared[0].job, None);
        assert_eq!(pool.metadata().await.disks[1].state, DiskState::Failed);
        // A disk in service has nothing to take back: its error counters
        // are all a clear of it changes.
        let in_service = pool.clear(Some(DiskIndex(0))).await.unwrap();
        assert!(in_service.is_empty(), "{in_service:?}");
        disks.faults[1].restore();
        let cleared = pool.clear(Some(DiskIndex(1))).await.unwrap();
        assert_eq!(cleared[0].refused, None, "{cleared:?}");
        assert_eq!(cleared[0].spaces[0].missed_extents, 1);
        with_jobs(&pool, jobs_settle(&pool)).await;
        check(&space, &model).await;
        assert_redundant(&space).await;
    });
}

/// The second disk fails under a write, which fails (the extent is beyond
/// tolerance) and was never acknowledged. Both disks are recorded to have
/// missed that extent; `clear` takes the disk that failed last as current
/// there, says so, and catches the first up from it. Every byte outside
/// that failed write reads back as written, and redundancy is whole.
#[test]
fn a_write_in_flight_at_the_second_failure_is_reported_uncertain() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        wait_for_missing_disks(&pool).await;
        let (space, mut model) = parity_on_three(&pool, 31).await;
        fail_under_write(&pool, &disks, &space, &mut model, 1, 0).await;
        disks.faults[2].lose();
        let torn = 3 * PARITY_EXTENT_BYTES;
        let failed = space
            .write(torn, bytes(vec![9; PARITY_EXTENT_BYTES as usize]), false)
            .await;
        assert!(failed.is_err(), "a write beyond tolerance fails");
        assert_eq!(pool.metadata().await.disks[2].state, DiskState::Failed);
        disks.faults[1].restore();
        disks.faults[2].restore();
        let cleared = pool.clear(None).await.unwrap();
        let of = |disk: u16| {
            let entry = cleared.iter().find(|c| c.disk == DiskIndex(disk)).unwrap();
            assert_eq!(entry.refused, None, "{entry:?}");
            entry.spaces[0].clone()
        };
        assert_eq!(of(1).missed_extents, 2, "extents 0 and 3");
        assert!(of(1).uncertain_extents.is_empty());
        assert_eq!(of(2).missed_extents, 0);
        assert_eq!(of(2).uncertain_extents, vec![3]);
        with_jobs(&pool, jobs_settle(&pool)).await;
        let read = space.read(0, space.size_bytes()).await.unwrap();
        let (start, end) = (torn as usize, (torn + PARITY_EXTENT_BYTES) as usize);
        assert!(
            read[..start] == model.bytes[..start],
            "before the failed write"
        );
        assert!(read[end..] == model.bytes[end..], "after the failed write");
        assert_redundant(&space).await;
    });
}

/// Writes still in a parity space's write-back log when two of its three
/// disks fail cannot go home. The pool imports all the same, holding the
/// space (clients refused, the log kept as it is); once the faults pass,
/// `clear` takes the disks back and the log goes home: every byte reads
/// back as written, and the space serves again.
#[test]
fn a_log_that_cannot_go_home_holds_its_space_until_clear() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        wait_for_missing_disks(&pool).await;
        let mut config = SpaceConfig::new(
            "p",
            Layout::Parity { redundancy: 1 },
            SpaceSize::Bytes(1 << 20),
        );
        config.cache_bytes = Some(256 << 10);
        let space = pool.create_space(config).await.unwrap().space;
        let journal = space.journal().expect("a write-back log");
        let mut model = fill(&space, 51).await;
        journal.destage(&space, true).await.unwrap();
        // No destage task runs here: these stay in the log only.
        let mut rng = SplitMix64::new(52);
        for extent in [1, 4] {
            let offset = extent * PARITY_EXTENT_BYTES + 8192;
            model.write_random(&space, &mut rng, offset, 4096).await;
        }
        assert!(journal.status().dirty_bytes > 0);
        disks.faults[1].lose();
        disks.faults[2].lose();
        assert!(space.read(0, space.size_bytes()).await.is_err());
        drop((journal, space));
        let _ = pool.close().await;
        disks.faults[1].restore();
        disks.faults[2].restore();
        // Both disks are recorded failed: the import leaves them out.
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .expect("the pool imports with its space held");
        let space = pool.space("p").unwrap();
        let held = space.held().expect("held");
        assert!(
            held.contains("clearing pool tank's disks takes them back"),
            "{held}"
        );
        assert!(space.read(0, 4096).await.is_err());
        assert!(space.write(0, bytes(vec![1; 4096]), false).await.is_err());
        let cleared = pool.clear(None).await.unwrap();
        assert!(
            cleared.iter().all(|entry| entry.refused.is_none()),
            "{cleared:?}"
        );
        assert_eq!(space.held(), None);
        with_jobs(&pool, jobs_settle(&pool)).await;
        check(&space, &model).await;
        assert_redundant(&space).await;
        space.write(0, bytes(vec![1; 4096]), false).await.unwrap();
    });
}

/// A disk taken back by `clear` is in service while it catches up, and
/// stays so across a restart before its resync ends: the import puts it
/// back in service under the same resync, which then brings it current.
#[test]
fn a_cleared_disk_still_catching_up_is_in_service_after_a_restart() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        wait_for_missing_disks(&pool).await;
        let (space, mut model) = parity_on_three(&pool, 61).await;
        fail_under_write(&pool, &disks, &space, &mut model, 1, 2).await;
        disks.faults[1].restore();
        let cleared = pool.clear(Some(DiskIndex(1))).await.unwrap();
        assert_eq!(cleared[0].spaces[0].missed_extents, 1, "{cleared:?}");
        // No job runner here: the resync has not run when the pool stops.
        drop(space);
        drop(pool);
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let space = pool.space("p").unwrap();
        let status = pool.status().await;
        assert_eq!(
            status.disks[1].condition,
            terrace_engine::Condition::Online,
            "in service, catching up: {:?}",
            status.disks[1]
        );
        let settled = with_jobs(&pool, jobs_settle(&pool)).await;
        assert!(
            settled.iter().all(|job| job.state == JobState::Done),
            "{settled:?}"
        );
        assert_eq!(pool.metadata().await.disks[1].state, DiskState::Active);
        check(&space, &model).await;
        assert_redundant(&space).await;
        // Disk 1 is current: without disk 0, it and disk 2 give it all.
        disks.faults[0].lose();
        check(&space, &model).await;
    });
}
