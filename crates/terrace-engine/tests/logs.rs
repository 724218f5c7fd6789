//! Where write-back logs go and how their redundancy is kept: a parity
//! space always gets a log (on capacity disks when the journal disks have
//! no room left), a space created without one gets one later, logs move
//! onto journal disks once they have room again, and a log copy lost with
//! its disk is re-created by the repair job, or said to find no room.

mod common;

use common::*;
use terrace_engine::layout::Layout;
use terrace_engine::meta::{DiskIndex, JobKind, JobState, PoolMetadata, SpaceRole};
use terrace_engine::{Pool, PoolConfig, SpaceConfig, SpaceSize};

const MIB: u64 = 1 << 20;
/// The default log of a parity space without room on journal disks.
const SMALL_LOG: u64 = 32 * MIB;

/// A pool of 1 MiB slabs over `capacity` disks of `capacity_bytes` and
/// `journals` journal disks of `journal_bytes`, the journal disks last.
async fn pool_of(disks: &Disks, capacity: usize, capacity_bytes: u64, journal_bytes: u64) -> Pool {
    let new_disks = journal_disks_after(&disks.devices, capacity);
    assert!(disks.memory[..capacity]
        .iter()
        .all(|m| terrace_engine::io::BlockDevice::size_bytes(m.as_ref()) == capacity_bytes));
    assert!(disks.memory[capacity..]
        .iter()
        .all(|m| terrace_engine::io::BlockDevice::size_bytes(m.as_ref()) == journal_bytes));
    let config = PoolConfig {
        slab_bytes: MIB,
        ..small_config("tank")
    };
    Pool::create(env(), config, new_disks).await.unwrap()
}

/// Memory disks: `capacity` of `capacity_bytes`, then `journals` of
/// `journal_bytes`.
fn disks_of_sizes(
    capacity: usize,
    capacity_bytes: u64,
    journals: usize,
    journal_bytes: u64,
) -> Disks {
    let mut disks = Disks::new(capacity, capacity_bytes);
    let more = Disks::new(journals, journal_bytes);
    disks.memory.extend(more.memory);
    disks.faults.extend(more.faults);
    disks.devices.extend(more.devices);
    disks
}

/// The disks holding the log of space `owner`.
fn log_disks_of(metadata: &PoolMetadata, owner: &str) -> Vec<u16> {
    let owner = metadata.space(owner).unwrap().id;
    let mut disks: Vec<u16> = metadata
        .spaces
        .iter()
        .filter(|s| s.role == SpaceRole::Log { owner })
        .flat_map(|s| s.extents.iter())
        .flat_map(|e| e.slabs.iter().flatten().map(|slab| slab.disk.0))
        .collect();
    disks.sort_unstable();
    disks.dedup();
    disks
}

/// Free slabs of disk `index`.
fn free_slabs(metadata: &PoolMetadata, index: u16) -> u64 {
    let used = metadata
        .used_slabs()
        .iter()
        .filter(|slab| slab.disk.0 == index)
        .count() as u64;
    u64::from(metadata.disks[usize::from(index)].slab_count) - used
}

/// A simple space "fill" whose log takes every free slab of the journal
/// disks `first..first + 2` (its two copies).
async fn fill_journal_disks(pool: &Pool, first: u16) {
    let metadata = pool.metadata().await;
    let free = free_slabs(&metadata, first).min(free_slabs(&metadata, first + 1));
    let mut config = SpaceConfig::new("fill", Layout::Simple, SpaceSize::Bytes(MIB));
    config.cache_bytes = Some(free * MIB);
    pool.create_space(config).await.unwrap();
    let metadata = pool.metadata().await;
    assert_eq!(free_slabs(&metadata, first), 0);
    assert_eq!(free_slabs(&metadata, first + 1), 0);
}

/// Journal disks filled by a simple space's log: a parity space created
/// after still gets a log, 32 MiB on the capacity disks, and its record
/// says where and why; one created with `--cache 0` has none until
/// `space cache` gives it one (also on capacity disks). Once the journal
/// disks have room again, the background job moves both logs there.
#[test]
fn a_parity_space_always_gets_a_log_and_it_moves_to_journal_disks_with_room() {
    block_on(async {
        let disks = disks_of_sizes(4, 48 * MIB, 2, 72 * MIB);
        let pool = pool_of(&disks, 4, 48 * MIB, 72 * MIB).await;
        fill_journal_disks(&pool, 4).await;
        let parity = Layout::Parity { redundancy: 1 };
        let created = pool
            .create_space(SpaceConfig::new("p", parity, SpaceSize::Bytes(4 * MIB)))
            .await
            .unwrap();
        let journal = created.space.journal().expect("a parity space has a log");
        assert_eq!(journal.status().bytes, SMALL_LOG);
        let metadata = pool.metadata().await;
        assert!(log_disks_of(&metadata, "p").iter().all(|&disk| disk < 4));
        let status = pool.status().await;
        let placement = &status
            .spaces
            .iter()
            .find(|s| s.name == "p")
            .unwrap()
            .cache
            .as_ref()
            .unwrap()
            .placement;
        assert_eq!(
            placement,
            "the write-back log of space p: 2 copies on capacity disks, as the journal disks \
             have no room left for 1G"
        );

        let mut bare = SpaceConfig::new("q", parity, SpaceSize::Bytes(4 * MIB));
        bare.cache_bytes = Some(0);
        let q = pool.create_space(bare).await.unwrap().space;
        assert!(q.journal().is_none(), "--cache 0 asks for none");
        assert_eq!(
            pool.set_cache_size("q", SMALL_LOG).await.unwrap(),
            SMALL_LOG
        );
        assert_eq!(q.journal().expect("given one").status().bytes, SMALL_LOG);
        let metadata = pool.metadata().await;
        assert!(log_disks_of(&metadata, "q").iter().all(|&disk| disk < 4));
        let model = {
            let mut model = Model::new(4 * MIB);
            model
                .write_random_ranges(&q, &mut SplitMix64::new(5), 40, 64 << 10)
                .await;
            model
        };

        pool.delete_space("fill").await.unwrap();
        let settled = with_jobs(&pool, jobs_settle(&pool)).await;
        assert!(
            settled
                .iter()
                .any(|s| s.kind == JobKind::LogsToJournal && s.state == JobState::Done),
            "{settled:?}"
        );
        let metadata = pool.metadata().await;
        assert_eq!(log_disks_of(&metadata, "p"), vec![4, 5]);
        assert_eq!(log_disks_of(&metadata, "q"), vec![4, 5]);
        q.journal().unwrap().drain(&q).await.unwrap();
        let read = q.read(0, 4 * MIB).await.unwrap();
        assert_eq!(&read[..], model.slice(0, 4 * MIB));
    });
}

/// A parity space as large as the pool allows still gets its log: the
/// space gives up the room the log needs.
#[test]
fn a_parity_space_of_the_largest_size_leaves_room_for_its_log() {
    block_on(async {
        let disks = Disks::new(4, 48 * MIB);
        let pool = pool_of(&disks, 4, 48 * MIB, 0).await;
        let parity = Layout::Parity { redundancy: 1 };
        let created = pool
            .create_space(SpaceConfig::new("p", parity, SpaceSize::Max))
            .await
            .unwrap();
        let journal = created.space.journal().expect("a parity space has a log");
        assert_eq!(journal.status().bytes, SMALL_LOG);
        assert!(created.space.size_bytes() > 0);
    });
}

/// A journal disk lost while the only room left is none: the repair of
/// its log copy is not started, the job list says why (failed, nothing
/// done of what it would move), and status names the disk a new disk or
/// a journal disk would take it on.
#[test]
fn a_lost_log_copy_without_room_is_said_to_need_a_disk() {
    block_on(async {
        let disks = disks_of_sizes(4, 48 * MIB, 2, 40 * MIB);
        let pool = pool_of(&disks, 4, 48 * MIB, 40 * MIB).await;
        // The journal disks keep room for p's log alone.
        let metadata = pool.metadata().await;
        let mut fill = SpaceConfig::new("fill", Layout::Simple, SpaceSize::Bytes(MIB));
        fill.cache_bytes = Some((free_slabs(&metadata, 4) - SMALL_LOG / MIB) * MIB);
        pool.create_space(fill).await.unwrap();
        let mut config = SpaceConfig::new(
            "p",
            Layout::Parity { redundancy: 1 },
            SpaceSize::Bytes(8 * MIB),
        );
        config.cache_bytes = Some(SMALL_LOG);
        let space = pool.create_space(config).await.unwrap().space;
        assert_eq!(log_disks_of(&pool.metadata().await, "p"), vec![4, 5]);
        // The capacity disks are full too.
        let mut rest = SpaceConfig::new("rest", Layout::Simple, SpaceSize::Max);
        rest.cache_bytes = Some(0);
        pool.create_space(rest.clone()).await.unwrap();
        // What its sums left over, a space without room for sums takes.
        rest.name = "left".into();
        let _ = pool.create_space(rest).await;
        let metadata = pool.metadata().await;
        for disk in 0..6 {
            assert_eq!(free_slabs(&metadata, disk), 0, "disk {disk}");
        }
        disks.faults[5].lose();
        space.write(0, bytes(vec![3; 4096]), false).await.unwrap();
        let statuses = with_jobs(&pool, async {
            for _ in 0..400 {
                let statuses = pool.job_statuses().await;
                if !statuses.is_empty() {
                    return statuses;
                }
                sleep(5).await;
            }
            panic!("no repair recorded")
        })
        .await;
        assert_eq!(statuses.len(), 1, "{statuses:?}");
        let job = &statuses[0];
        assert_eq!(job.kind, JobKind::Repair { disk: DiskIndex(5) });
        assert_eq!(job.state, JobState::Failed);
        assert!(
            job.reason
                .starts_with("no repair started: no room to re-create extent 0 of space ")
                && job.reason.contains(" (its write-back log): "),
            "{}",
            job.reason
        );
        assert_eq!(job.bytes_done, 0);
        assert!(job.bytes_total >= SMALL_LOG, "{job:?}");
        let status = pool.status().await;
        let unrepaired = status.disks[5].unrepaired.clone().expect("said");
        assert!(unrepaired.logs_only);
        assert!(unrepaired.slabs >= SMALL_LOG / MIB, "{unrepaired:?}");
        assert!(unrepaired.disk_bytes > unrepaired.slabs * MIB);
        assert_eq!(status.disks[4].unrepaired, None, "online");
        drop(space);
    });
}
