//! Scrub as a job: it rewrites mirror copies that differ and says how many
//! rows it repaired, finds nothing the second time, resumes from its
//! cursor after the pool was closed mid-way, and starts by itself when the
//! pool's interval has passed.

mod common;

use std::sync::Arc;

use common::*;
use terrace_engine::layout::Layout;
use terrace_engine::meta::format::{data_offset, METADATA_SLOT_MIN_BYTES};
use terrace_engine::meta::{JobKind, JobState, SlabRef};
use terrace_engine::{ImportOptions, JobAction, JobStatus, Pool, Space, SpaceConfig, SpaceSize};

const DISK_BYTES: u64 = 16 << 20;
const INTERLEAVE: u64 = 4096;
const EXTENTS: u64 = 8;
/// One extent of the 2-way mirror below read from both disks: its rows
/// times the interleave, on each of two slots.
const EXTENT_DISK_BYTES: u64 = 2 * SLAB;
const DAY_NS: u64 = 24 * 3600 * 1_000_000_000;

/// A 2-way mirror of one column over two disks, written whole.
async fn mirror(pool: &Pool) -> Arc<Space> {
    let mut config = SpaceConfig::new(
        "m",
        Layout::Mirror { copies: 2 },
        SpaceSize::Bytes(EXTENTS * SLAB),
    );
    config.columns = Some(1);
    config.interleave_bytes = Some(INTERLEAVE);
    config.cache_bytes = Some(0);
    let space = pool.create_space(config).await.unwrap().space;
    let mut rng = SplitMix64::new(11);
    for offset in (0..space.size_bytes()).step_by(SLAB as usize) {
        space
            .write(offset, bytes(rng.bytes(SLAB as usize)), false)
            .await
            .unwrap();
    }
    space.flush().await.unwrap();
    space
}

/// The slabs of the space's extents, by extent.
async fn slabs(pool: &Pool) -> Vec<Vec<SlabRef>> {
    let metadata = pool.metadata().await;
    let extents = &metadata.space("m").unwrap().extents;
    extents.iter().map(|e| e.slabs.clone().unwrap()).collect()
}

/// Where `row` of `slab` lies on its disk.
fn disk_offset(slab: SlabRef, row: u64) -> u64 {
    data_offset(METADATA_SLOT_MIN_BYTES) + u64::from(slab.slab.0) * SLAB + row * INTERLEAVE
}

/// Overwrite row `row` of copy 1 of every extent in `extents`, behind the
/// engine.
async fn damage(disks: &Disks, pool: &Pool, extents: &[usize], row: u64) {
    let slabs = slabs(pool).await;
    for &extent in extents {
        let slab = slabs[extent][1];
        disks.memory[usize::from(slab.disk.0)]
            .write_sync(disk_offset(slab, row), &[0xee; INTERLEAVE as usize]);
    }
}

/// Whether both copies of `row` of every extent agree on the disks.
async fn copies_agree(disks: &Disks, pool: &Pool, row: u64) -> Vec<bool> {
    let read = |slab: SlabRef| {
        disks.memory[usize::from(slab.disk.0)]
            .read_sync(disk_offset(slab, row), INTERLEAVE as usize)
    };
    let slabs = slabs(pool).await;
    slabs.iter().map(|s| read(s[0]) == read(s[1])).collect()
}

/// The bytes a scrub reads: every slab of every extent of every space,
/// hidden ones (the mirror's sums) too.
async fn disk_bytes(pool: &Pool) -> u64 {
    let metadata = pool.metadata().await;
    let extents = metadata
        .spaces
        .iter()
        .flat_map(|space| space.extents.iter());
    let slabs = extents.filter_map(|extent| extent.slabs.as_ref());
    slabs.map(|slabs| slabs.len() as u64 * SLAB).sum()
}

/// The extents of the mirror a scrub whose cursor is `cursor` has still
/// to check: those whose lowest slab (then its disk) is at or past it.
async fn extents_past(pool: &Pool, cursor: u64) -> u64 {
    let key = |slabs: &Vec<SlabRef>| {
        let keys = slabs
            .iter()
            .map(|s| (u64::from(s.slab.0) << 16) | u64::from(s.disk.0));
        keys.min().unwrap()
    };
    let slabs = slabs(pool).await;
    slabs.iter().filter(|slabs| key(slabs) >= cursor).count() as u64
}

fn scrub_status(statuses: &[JobStatus], id: u64) -> JobStatus {
    let status = statuses.iter().find(|s| s.id == id).expect("the scrub");
    assert_eq!(status.kind, JobKind::Scrub);
    status.clone()
}

/// Scrub the pool to its end; its status.
async fn scrub(pool: &Pool) -> JobStatus {
    with_jobs(pool, async {
        let id = pool.start_scrub(0).await.unwrap();
        scrub_status(&jobs_settle(pool).await, id)
    })
    .await
}

#[test]
fn a_scrub_rewrites_copies_that_differ_and_finds_nothing_the_second_time() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let space = mirror(&pool).await;
        let before = space.read(0, space.size_bytes()).await.unwrap();
        damage(&disks, &pool, &[1, 4, 6], 3).await;
        assert_eq!(
            copies_agree(&disks, &pool, 3).await,
            [true, false, true, true, false, true, false, true]
        );

        let first = scrub(&pool).await;
        assert_eq!(first.state, JobState::Done, "{first:?}");
        assert_eq!((first.repaired, first.unrepaired), (3, 0), "{first:?}");
        assert_eq!(first.bytes_done, disk_bytes(&pool).await, "{first:?}");
        assert_eq!(first.bytes_total, first.bytes_done, "{first:?}");
        assert!(
            first
                .reason
                .contains("3 rows repaired, 0 could not be repaired"),
            "{first:?}"
        );
        assert_eq!(copies_agree(&disks, &pool, 3).await, [true; 8]);
        // The copy rewritten is the damaged one: the data is as written.
        assert_eq!(space.read(0, space.size_bytes()).await.unwrap(), before);

        let second = scrub(&pool).await;
        assert_eq!(second.state, JobState::Done, "{second:?}");
        assert_eq!((second.repaired, second.unrepaired), (0, 0), "{second:?}");
        pool.close().await.unwrap();
    });
}

#[test]
fn a_second_scrub_is_refused_while_one_is_under_way() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        mirror(&pool).await;
        let first = pool.start_scrub(0).await.unwrap();
        let error = pool.start_scrub(0).await.unwrap_err();
        assert!(
            matches!(error, terrace_engine::EngineError::ScrubRunning { id } if id == first),
            "{error}"
        );
        pool.close().await.unwrap();
    });
}

#[test]
fn a_scrub_closed_mid_way_resumes_from_its_cursor_after_import() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        mirror(&pool).await;
        // One extent a second.
        let id = with_jobs(&pool, async {
            let id = pool.start_scrub(EXTENT_DISK_BYTES).await.unwrap();
            sleep(3_500).await;
            pool.job_action(id, JobAction::Pause).await.unwrap();
            id
        })
        .await;
        let paused = pool.metadata().await;
        let record = paused.jobs.iter().find(|job| job.id == id).unwrap().clone();
        assert_eq!(record.state, JobState::Paused);
        assert!(record.cursor > 0, "{record:?}");
        assert!(
            record.bytes_done >= 2 * EXTENT_DISK_BYTES
                && record.bytes_done < EXTENTS * EXTENT_DISK_BYTES,
            "{record:?}"
        );
        pool.close().await.unwrap();

        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let imported = pool.metadata().await;
        let again = imported.jobs.iter().find(|job| job.id == id).unwrap();
        assert_eq!(
            (again.cursor, again.bytes_done),
            (record.cursor, record.bytes_done)
        );
        // Every extent damaged: only those past the cursor are checked.
        let left = extents_past(&pool, record.cursor).await;
        assert!(left > 0 && left < EXTENTS, "{record:?}");
        let all: Vec<usize> = (0..EXTENTS as usize).collect();
        damage(&disks, &pool, &all, 0).await;
        let status = with_jobs(&pool, async {
            pool.job_action(id, JobAction::Resume).await.unwrap();
            scrub_status(&jobs_settle(&pool).await, id)
        })
        .await;
        assert_eq!(status.state, JobState::Done, "{status:?}");
        assert_eq!(status.repaired, left, "{status:?}");
        let agree = copies_agree(&disks, &pool, 0).await;
        assert_eq!(
            agree.iter().filter(|agrees| !**agrees).count() as u64,
            EXTENTS - left,
            "{agree:?}"
        );
        pool.close().await.unwrap();
    });
}

#[test]
fn a_scrub_starts_by_itself_once_the_interval_has_passed() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        mirror(&pool).await;
        let mut settings = pool.metadata().await.settings;
        let created_ns = settings.scrub_last_ns;
        settings.scrub_interval_secs = 24 * 3600;
        pool.set_settings(settings).await.unwrap();
        let scrubs = |statuses: Vec<JobStatus>| {
            statuses
                .into_iter()
                .filter(|status| status.kind == JobKind::Scrub)
                .collect::<Vec<_>>()
        };
        with_jobs(&pool, sleep(2_000)).await;
        assert!(scrubs(pool.job_statuses().await).is_empty());

        env().sleep(DAY_NS).await;
        let started = with_jobs(&pool, async {
            let statuses = jobs_settle(&pool).await;
            scrubs(statuses)
        })
        .await;
        assert_eq!(started.len(), 1, "{started:?}");
        assert_eq!(started[0].state, JobState::Done, "{started:?}");
        let metadata = pool.metadata().await;
        assert!(
            metadata.settings.scrub_last_ns >= created_ns + DAY_NS,
            "{:?}",
            metadata.settings
        );
        // The next is a day away again: none starts meanwhile.
        with_jobs(&pool, sleep(2_000)).await;
        assert_eq!(scrubs(pool.job_statuses().await).len(), 1);
        pool.close().await.unwrap();
    });
}

#[test]
fn a_fix_that_never_reaches_its_disk_is_counted_not_repaired() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        mirror(&pool).await;
        let first = slabs(&pool)
            .await
            .into_iter()
            .min_by_key(|s| s[0].slab)
            .unwrap();
        damage(&disks, &pool, &[0], 2).await;
        let copy = usize::from(slabs(&pool).await[0][1].disk.0);
        let status = with_jobs(&pool, async {
            let id = pool.start_scrub(0).await.unwrap();
            // The next write to the damaged copy's disk, the fix, is lost.
            disks.faults[copy].lose_writes(1);
            scrub_status(&jobs_settle(&pool).await, id)
        })
        .await;
        assert_eq!(first, slabs(&pool).await[0], "extent 0 is scrubbed first");
        assert_eq!((status.repaired, status.unrepaired), (0, 1), "{status:?}");
        assert!(
            status
                .reason
                .contains("0 rows repaired, 1 could not be repaired"),
            "{status:?}"
        );
        assert_eq!(disks.faults[copy].counters().lost_writes, 1);
        pool.close().await.unwrap();
    });
}

#[test]
fn a_scrub_cut_off_resumes_from_the_cursor_it_last_committed() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        mirror(&pool).await;
        // One extent a second; the cursor commits about once a second.
        let id = with_jobs(&pool, async {
            let id = pool.start_scrub(EXTENT_DISK_BYTES).await.unwrap();
            sleep(3_500).await;
            id
        })
        .await;
        // Closed without a pause: only what the scrub committed is kept.
        pool.close().await.unwrap();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let record = pool
            .metadata()
            .await
            .jobs
            .into_iter()
            .find(|job| job.id == id);
        let record = record.unwrap();
        assert_eq!(record.state, JobState::Running);
        let done = record.bytes_done / EXTENT_DISK_BYTES;
        let left = extents_past(&pool, record.cursor).await;
        assert!(
            (2..EXTENTS).contains(&done) && (1..EXTENTS).contains(&left),
            "{record:?}"
        );
        let all: Vec<usize> = (0..EXTENTS as usize).collect();
        damage(&disks, &pool, &all, 5).await;
        let status = with_jobs(&pool, async { scrub_status(&jobs_settle(&pool).await, id) }).await;
        assert_eq!(status.state, JobState::Done, "{status:?}");
        assert_eq!(status.repaired, left, "{status:?}");
        pool.close().await.unwrap();
    });
}

#[test]
fn a_scrub_waits_for_a_repair() {
    block_on(async {
        let disks = Disks::new(3, DISK_BYTES);
        let pool = create_pool(&disks).await;
        mirror(&pool).await;
        let lost = slabs(&pool).await[0][1].disk;
        pool.disk_gone(lost, "pulled").await.unwrap();
        let repair = pool.start_repair(lost).await.unwrap();
        let error = pool.start_scrub(0).await.unwrap_err();
        assert!(
            matches!(error, terrace_engine::EngineError::ScrubDuringRepair { id } if id == repair),
            "{error}"
        );
        assert!(pool
            .job_statuses()
            .await
            .iter()
            .all(|status| status.kind != JobKind::Scrub));
        pool.close().await.unwrap();
    });
}

/// A pool from a build without a scrub schedule (no last scrub) counts
/// its interval from its import, not from long ago.
#[test]
fn a_pool_that_never_scrubbed_counts_its_schedule_from_its_import() {
    block_on(async {
        let disks = Disks::new(2, DISK_BYTES);
        let pool = create_pool(&disks).await;
        mirror(&pool).await;
        let mut settings = pool.metadata().await.settings;
        assert!(settings.scrub_last_ns > 0, "set at creation: {settings:?}");
        settings.scrub_last_ns = 0;
        pool.set_settings(settings).await.unwrap();
        pool.close().await.unwrap();
        env().sleep(DAY_NS).await;
        let before = env().wall_clock_ns();
        let pool = Pool::import(env(), disks.devices.clone(), ImportOptions::default())
            .await
            .unwrap();
        let settings = pool.metadata().await.settings;
        assert!(settings.scrub_last_ns >= before, "{settings:?}");
        with_jobs(&pool, sleep(1_000)).await;
        let statuses = pool.job_statuses().await;
        assert!(
            statuses.iter().all(|s| s.kind != JobKind::Scrub),
            "{statuses:?}"
        );
        pool.close().await.unwrap();
    });
}
