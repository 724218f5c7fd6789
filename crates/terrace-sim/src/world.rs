//! Everything outside the engine that takes time: disk operations in flight
//! and timers. The executor asks the world to complete one pending thing
//! whenever no task is ready, choosing which with the seeded generator; that
//! is how operations in flight together complete in every possible order.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use terrace_engine::io::{BlockDevice, BoxFuture, Bytes, BytesMut, Env, IoResult};

use crate::random::Random;

#[derive(Default)]
struct State {
    next_id: u64,
    /// Gates waiting for the world, with their wakers.
    pending: Vec<(u64, Waker)>,
    released: BTreeSet<u64>,
    now_ns: u64,
    /// Sleeping gates: (deadline, id, waker once polled).
    timers: Vec<(u64, u64, Option<Waker>)>,
    random: Option<Random>,
}

#[derive(Default)]
pub struct World {
    state: Mutex<State>,
}

impl World {
    pub fn new(seed: u64) -> Arc<World> {
        let world = World::default();
        world.lock().random = Some(Random::new(seed ^ 0x5eed_5eed_5eed_5eed));
        Arc::new(world)
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Complete one pending operation (or fire the next timer). False when
    /// nothing is pending at all.
    pub fn complete_one(&self, random: &mut Random) -> bool {
        let mut state = self.lock();
        if !state.pending.is_empty() {
            let index = random.below(state.pending.len() as u64) as usize;
            let (id, waker) = state.pending.swap_remove(index);
            state.released.insert(id);
            drop(state);
            waker.wake();
            return true;
        }
        let Some(deadline) = state.timers.iter().map(|t| t.0).min() else {
            return false;
        };
        state.now_ns = state.now_ns.max(deadline);
        let (due, waiting): (Vec<_>, Vec<_>) =
            state.timers.drain(..).partition(|t| t.0 <= deadline);
        state.timers = waiting;
        let mut wakers = Vec::new();
        for (_, id, waker) in due {
            state.released.insert(id);
            wakers.extend(waker);
        }
        drop(state);
        wakers.into_iter().for_each(Waker::wake);
        true
    }

    /// Forget everything in flight (a power cut).
    pub fn reset(&self) {
        let mut state = self.lock();
        state.pending.clear();
        state.released.clear();
        state.timers.clear();
    }

    fn gate(self: &Arc<Self>, deadline: Option<u64>) -> Gate {
        let mut state = self.lock();
        let id = state.next_id;
        state.next_id += 1;
        if let Some(deadline) = deadline {
            state.timers.push((deadline, id, None));
        }
        Gate {
            world: self.clone(),
            id,
        }
    }
}

/// A future that completes when the world says so.
struct Gate {
    world: Arc<World>,
    id: u64,
}

impl Future for Gate {
    type Output = ();
    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let mut state = self.world.lock();
        if state.released.remove(&self.id) {
            return Poll::Ready(());
        }
        let id = self.id;
        if let Some(timer) = state.timers.iter_mut().find(|t| t.1 == id) {
            timer.2 = Some(context.waker().clone());
            return Poll::Pending;
        }
        state.pending.retain(|(pending, _)| *pending != id);
        state.pending.push((id, context.waker().clone()));
        Poll::Pending
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let mut state = self.world.lock();
        state.pending.retain(|(id, _)| *id != self.id);
        state.released.remove(&self.id);
        state.timers.retain(|t| t.1 != self.id);
    }
}

/// Time and randomness for the engine, from the world.
pub struct SimEnv {
    world: Arc<World>,
}

impl SimEnv {
    pub fn new(world: Arc<World>) -> Arc<SimEnv> {
        Arc::new(SimEnv { world })
    }
}

/// Wall-clock origin of simulated time: 2026-01-01T00:00:00Z.
const WALL_CLOCK_ORIGIN_NS: u64 = 1_767_225_600_000_000_000;

impl Env for SimEnv {
    fn now_ns(&self) -> u64 {
        self.world.lock().now_ns
    }

    fn wall_clock_ns(&self) -> u64 {
        WALL_CLOCK_ORIGIN_NS + self.now_ns()
    }

    fn sleep(&self, duration_ns: u64) -> BoxFuture<()> {
        let deadline = self.now_ns() + duration_ns;
        Box::pin(self.world.gate(Some(deadline)))
    }

    fn random_u64(&self) -> u64 {
        let mut state = self.world.lock();
        state.random.as_mut().map_or(0, Random::next_u64)
    }
}

/// What a simulated disk says of itself. A run chooses, so that the
/// engine's choices on both answers are checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskTraits {
    /// Its answer to [`BlockDevice::cheap_fua`]: logs write every record
    /// with FUA, or flush behind records.
    pub cheap_fua: bool,
    /// Its answer to [`BlockDevice::allocates_on_first_write`]: a new log's
    /// slabs are written ahead, or the ring starts on their old bytes.
    pub allocates: bool,
}

/// A disk whose every operation waits for the world before it happens.
pub struct SimDisk {
    world: Arc<World>,
    inner: Arc<dyn BlockDevice>,
    traits: DiskTraits,
}

impl SimDisk {
    pub fn new(world: Arc<World>, inner: Arc<dyn BlockDevice>, traits: DiskTraits) -> SimDisk {
        SimDisk {
            world,
            inner,
            traits,
        }
    }
}

impl BlockDevice for SimDisk {
    terrace_engine::io::forward_device_answers!(inner: name, size_bytes, alignment);

    fn cheap_fua(&self) -> bool {
        self.traits.cheap_fua
    }
    fn allocates_on_first_write(&self) -> bool {
        self.traits.allocates
    }
    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        let gate = self.world.gate(None);
        let inner = self.inner.clone();
        Box::pin(async move {
            gate.await;
            inner.read(offset, buf).await
        })
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        let gate = self.world.gate(None);
        let inner = self.inner.clone();
        Box::pin(async move {
            gate.await;
            inner.write(offset, data, fua).await
        })
    }
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        let gate = self.world.gate(None);
        let inner = self.inner.clone();
        Box::pin(async move {
            gate.await;
            inner.write_zeroes(offset, length, fua).await
        })
    }
    fn flush(&self) -> BoxFuture<IoResult<()>> {
        let gate = self.world.gate(None);
        let inner = self.inner.clone();
        Box::pin(async move {
            gate.await;
            inner.flush().await
        })
    }
}
