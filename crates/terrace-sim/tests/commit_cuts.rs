//! A metadata commit cut by a power failure at every step: import always
//! finds a complete generation, the pool opens read-write, the earlier state
//! is intact, and a change that was acknowledged before the cut survives.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use terrace_engine::layout::Layout;
use terrace_engine::meta::format::METADATA_SLOT_MIN_BYTES;
use terrace_engine::{ImportOptions, NewDisk, Pool, PoolConfig, SpaceConfig, SpaceSize};
use terrace_sim::disks::{SimDisks, SLAB_BYTES};
use terrace_sim::executor::{Executor, Stop};
use terrace_sim::random::Random;
use terrace_sim::world::World;

fn config() -> PoolConfig {
    PoolConfig {
        name: "cut".into(),
        slab_bytes: SLAB_BYTES,
        metadata_slot_bytes: METADATA_SLOT_MIN_BYTES,
    }
}

fn space(name: &str) -> SpaceConfig {
    SpaceConfig::new(
        name,
        Layout::Mirror { copies: 2 },
        SpaceSize::Bytes(128 << 10),
    )
}

/// Cut the power after `steps` steps of creating space "b"; returns whether
/// the creation had completed, and whether the budget was what stopped it.
fn cut_during_create(steps: u64, seed: u64) -> (bool, bool) {
    let random = Rc::new(RefCell::new(Random::new(seed)));
    let world = World::new(seed);
    let disks = SimDisks::new(world.clone(), 5, 16);
    let mut executor = Executor::new(random.clone(), world.clone());
    let (env, devices) = (disks.env.clone(), disks.devices.clone());
    let pool = executor.block_on(async move {
        let new_disks = devices.iter().map(|d| NewDisk::new(d.clone())).collect();
        let pool = Pool::create(env, config(), new_disks)
            .await
            .expect("create");
        let a = pool.create_space(space("a")).await.expect("space a").space;
        a.write(0, vec![7u8; 64 << 10].into(), false)
            .await
            .expect("write");
        a.flush().await.expect("flush");
        Rc::new(pool)
    });
    let done = Rc::new(Cell::new(false));
    let (task_pool, task_done) = (pool.clone(), done.clone());
    executor.spawn(async move {
        task_pool.create_space(space("b")).await.expect("space b");
        task_done.set(true);
    });
    let stop = executor.run(steps);
    let finished = done.get();
    drop(executor);
    drop(pool);
    disks
        .power_cut(&mut random.borrow_mut())
        .expect("power cut");

    let mut executor = Executor::new(random, world);
    let (env, devices) = (disks.env.clone(), disks.devices.clone());
    executor.block_on(async move {
        let pool = Pool::import(env, devices, ImportOptions::default())
            .await
            .expect("import after a cut");
        assert!(
            pool.read_only_reason().is_none(),
            "steps {steps}: {:?}",
            pool.read_only_reason()
        );
        let a = pool.space("a").expect("space a survives");
        assert!(a
            .read(0, 64 << 10)
            .await
            .expect("read a")
            .iter()
            .all(|&b| b == 7));
        if finished {
            assert!(
                pool.space("b").is_some(),
                "steps {steps}: acknowledged space b lost"
            );
        }
        if let Some(b) = pool.space("b") {
            assert!(b
                .read(0, 128 << 10)
                .await
                .expect("read b")
                .iter()
                .all(|&byte| byte == 0));
        }
        pool.close().await.expect("close");
    });
    (finished, stop == Stop::Budget)
}

#[test]
fn a_commit_cut_at_every_step_imports_consistently() {
    let mut steps = 0;
    loop {
        steps += 1;
        let mut completed_everywhere = true;
        for seed in 0..3 {
            let (finished, cut) = cut_during_create(steps, seed * 1000 + steps);
            completed_everywhere &= finished && !cut;
        }
        if completed_everywhere {
            break;
        }
        assert!(steps < 5000, "space creation never completes");
    }
    eprintln!("space creation cut at each of {steps} steps");
    assert!(
        steps > 10,
        "the commit took only {steps} steps: the cut points are too coarse"
    );
}
