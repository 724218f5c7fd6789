//! What a pool tells its subscribers as it happens: a disk's condition
//! changing, the commit recording it, a job starting and ending.

mod common;

use common::*;
use futures::executor::block_on;
use terrace_engine::layout::Layout;
use terrace_engine::meta::{DiskIndex, JobKind};
use terrace_engine::{Condition, PoolEvent, SpaceConfig, SpaceSize};

const DISK_BYTES: u64 = 4 << 20;

/// The events waiting now, in order.
fn told(events: &mut futures::channel::mpsc::Receiver<PoolEvent>) -> Vec<PoolEvent> {
    std::iter::from_fn(|| events.try_recv().ok()).collect()
}

#[test]
fn a_disk_failing_and_its_repair_are_told_as_they_happen() {
    block_on(async {
        let disks = Disks::new(4, DISK_BYTES);
        let pool = create_pool(&disks).await;
        let mut config = SpaceConfig::new(
            "m",
            Layout::Mirror { copies: 2 },
            SpaceSize::Bytes(256 << 10),
        );
        config.interleave_bytes = Some(4096);
        let space = pool.create_space(config).await.unwrap().space;
        let mut events = pool.subscribe();
        assert!(told(&mut events).is_empty(), "nothing happened yet");

        disks.faults[1].fail_writes(0..u64::MAX);
        space
            .write(0, bytes(vec![0x5a; 64 << 10]), false)
            .await
            .unwrap();
        let generation = pool.metadata().await.generation;
        let events_now = told(&mut events);
        let failed = events_now.iter().position(|event| {
            matches!(event, PoolEvent::DiskCondition { disk: DiskIndex(1), condition: Condition::Failed, reason } if reason.contains("injected"))
        });
        let committed = events_now
            .iter()
            .position(|event| *event == PoolEvent::Committed { generation });
        assert!(
            matches!((failed, committed), (Some(f), Some(c)) if f < c),
            "the failure, then the commit recording it: {events_now:?}"
        );

        let job = pool
            .start_job(JobKind::Repair { disk: DiskIndex(1) })
            .await
            .unwrap();
        assert!(told(&mut events).contains(&PoolEvent::JobStarted { job }));
        with_jobs(&pool, jobs_settle(&pool)).await;
        assert!(told(&mut events).contains(&PoolEvent::JobEnded { job }));
    });
}
