//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use futures::executor::{LocalPool, LocalSpawner};

use terrace_engine::io::crash::CrashDevice;
use terrace_engine::io::fault::{FaultControls, FaultDevice};
use terrace_engine::io::memory::MemoryDevice;
use terrace_engine::io::virtual_clock::VirtualEnv;
use terrace_engine::io::{BlockDevice, BoxFuture, Bytes, BytesMut, Env, IoResult};
use terrace_engine::layout::Layout;
use terrace_engine::meta::format::METADATA_SLOT_MIN_BYTES;
use terrace_engine::{NewDisk, Pool, PoolConfig};

pub const SLAB: u64 = 64 << 10;

thread_local! {
    static CLOCK: Arc<VirtualEnv> = VirtualEnv::new(CLOCK_SEED);
}

/// The seed of each test thread's randomness (pool identifiers, epochs).
const CLOCK_SEED: u64 = 0x7e57;

/// The environment of this test: virtual time that [`block_on`] and
/// [`Executor`] move on whenever no task can go on, one clock per test
/// thread.
pub fn env() -> Arc<dyn Env> {
    clock()
}

/// This test thread's virtual clock.
pub fn clock() -> Arc<VirtualEnv> {
    CLOCK.with(Arc::clone)
}

/// Run `future` to its end on this thread's virtual clock.
pub fn block_on<F: Future>(future: F) -> F::Output {
    Executor::new().run_until(future)
}

/// A single-threaded executor for tests that spawn tasks, on this thread's
/// virtual clock: time moves only when every task waits.
pub struct Executor {
    pool: LocalPool,
}

impl Default for Executor {
    fn default() -> Self {
        Executor::new()
    }
}

impl Executor {
    pub fn new() -> Executor {
        Executor {
            pool: LocalPool::new(),
        }
    }

    pub fn spawner(&self) -> LocalSpawner {
        self.pool.spawner()
    }

    /// Run the spawned tasks until none can go on, without moving the
    /// clock.
    pub fn run_until_stalled(&mut self) {
        self.pool.run_until_stalled();
    }

    /// Run `future` and the spawned tasks until `future` ends; when none
    /// can go on, move the clock to the next deadline. A test whose tasks
    /// all wait with no deadline to reach is stuck: it panics.
    pub fn run_until<F: Future>(&mut self, future: F) -> F::Output {
        let clock = clock();
        let mut future = std::pin::pin!(future);
        let woken = Arc::new(Woken {
            flag: AtomicBool::new(true),
            thread: std::thread::current(),
        });
        let waker = Waker::from(woken.clone());
        let mut context = Context::from_waker(&waker);
        let mut idle_since = None;
        loop {
            if woken.flag.swap(false, Ordering::SeqCst) {
                idle_since = None;
                if let Poll::Ready(value) = future.as_mut().poll(&mut context) {
                    return value;
                }
            }
            self.pool.run_until_stalled();
            if woken.flag.load(Ordering::SeqCst) {
                continue;
            }
            if clock.advance() {
                idle_since = None;
                continue;
            }
            // Nothing is due: only another thread can wake a task now (a
            // file's I/O completing; nothing does with memory disks).
            let idle = *idle_since.get_or_insert_with(std::time::Instant::now);
            assert!(
                idle.elapsed() < STUCK_AFTER,
                "stuck: every task waits and no sleep has a deadline to reach"
            );
            std::thread::park_timeout(STUCK_AFTER / 100);
        }
    }
}

/// How long a test whose tasks all wait, with no sleep to end, may wait
/// for another thread before it counts as stuck.
const STUCK_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

struct Woken {
    flag: AtomicBool,
    thread: std::thread::Thread,
}

impl std::task::Wake for Woken {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        self.flag.store(true, Ordering::SeqCst);
        self.thread.unpark();
    }
}

pub use terrace_engine::io::random::SplitMix64;

/// Memory disks wrapped in fault injectors; with [`Disks::with_power`], a
/// volatile cache between the two that a power cut can lose.
pub struct Disks {
    pub memory: Vec<Arc<MemoryDevice>>,
    pub faults: Vec<FaultControls>,
    pub devices: Vec<Arc<dyn BlockDevice>>,
    /// The volatile caches ([`Disks::with_power`] only).
    pub caches: Vec<Arc<CrashDevice>>,
}

impl Disks {
    pub fn new(count: usize, size_bytes: u64) -> Disks {
        Disks::stacked(count, size_bytes, false)
    }

    /// Disks whose writes stay volatile until flushed (or written FUA):
    /// [`Disks::power_cut`] drops them.
    pub fn with_power(count: usize, size_bytes: u64) -> Disks {
        Disks::stacked(count, size_bytes, true)
    }

    fn stacked(count: usize, size_bytes: u64, cached: bool) -> Disks {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let memory: Vec<Arc<MemoryDevice>> = (0..count)
            .map(|_| {
                let number = NEXT.fetch_add(1, Ordering::Relaxed);
                Arc::new(MemoryDevice::new(format!("memory:{number}"), size_bytes))
            })
            .collect();
        let caches: Vec<Arc<CrashDevice>> = if cached {
            memory
                .iter()
                .map(|m| Arc::new(CrashDevice::new(m.clone())))
                .collect()
        } else {
            Vec::new()
        };
        let below: Vec<Arc<dyn BlockDevice>> = if cached {
            caches
                .iter()
                .map(|c| c.clone() as Arc<dyn BlockDevice>)
                .collect()
        } else {
            memory
                .iter()
                .map(|m| m.clone() as Arc<dyn BlockDevice>)
                .collect()
        };
        let wrapped: Vec<FaultDevice> = below.into_iter().map(FaultDevice::new).collect();
        let faults = wrapped.iter().map(FaultDevice::controls).collect();
        let devices = wrapped
            .into_iter()
            .map(|device| Arc::new(device) as Arc<dyn BlockDevice>)
            .collect();
        Disks {
            memory,
            faults,
            devices,
            caches,
        }
    }

    /// The power goes: every write not yet flushed is lost.
    pub fn power_cut(&self) {
        const DROPPED: u64 = 1;
        for cache in &self.caches {
            cache.crash(&mut || DROPPED).unwrap();
        }
    }

    pub fn new_disks(&self) -> Vec<NewDisk> {
        self.devices
            .iter()
            .map(|device| NewDisk::new(device.clone()))
            .collect()
    }
}

pub fn small_config(name: &str) -> PoolConfig {
    PoolConfig {
        name: name.into(),
        slab_bytes: SLAB,
        metadata_slot_bytes: METADATA_SLOT_MIN_BYTES,
    }
}

pub async fn create_pool(disks: &Disks) -> Pool {
    pool_on(small_config("tank"), &disks.devices).await
}

/// The dirty records a read-only import of `devices` finds: what a power
/// cut left durable, with nothing written by the import itself.
pub async fn dirty_found(
    devices: &[Arc<dyn BlockDevice>],
) -> Vec<terrace_engine::meta::DirtyRecord> {
    let options = terrace_engine::ImportOptions {
        read_only: true,
        ..Default::default()
    };
    let pool = Pool::import(env(), devices.to_vec(), options)
        .await
        .expect("read-only import");
    let dirty = pool.metadata().await.dirty;
    pool.close().await.expect("close");
    dirty
}

/// `devices` as new disks: the first `capacity` capacity disks, the rest
/// journal disks.
pub fn journal_disks_after(devices: &[Arc<dyn BlockDevice>], capacity: usize) -> Vec<NewDisk> {
    devices
        .iter()
        .enumerate()
        .map(|(index, device)| {
            let mut disk = NewDisk::new(device.clone());
            if index >= capacity {
                disk.usage = terrace_engine::meta::Usage::Journal;
            }
            disk
        })
        .collect()
}

/// A pool of `config` on `devices`: the first `capacity` capacity disks,
/// the rest journal disks.
pub async fn journal_pool(
    config: PoolConfig,
    devices: &[Arc<dyn BlockDevice>],
    capacity: usize,
) -> Pool {
    Pool::create(env(), config, journal_disks_after(devices, capacity))
        .await
        .expect("create pool")
}

/// A pool of `config` on `devices`, all capacity disks.
pub async fn pool_on(config: PoolConfig, devices: &[Arc<dyn BlockDevice>]) -> Pool {
    let new_disks = devices.iter().map(|d| NewDisk::new(d.clone())).collect();
    Pool::create(env(), config, new_disks)
        .await
        .expect("create pool")
}

pub fn layouts() -> Vec<(Layout, &'static str)> {
    vec![
        (Layout::Simple, "simple"),
        (Layout::Mirror { copies: 2 }, "mirror2"),
        (Layout::Mirror { copies: 3 }, "mirror3"),
        (Layout::Parity { redundancy: 1 }, "parity1"),
        (Layout::Parity { redundancy: 2 }, "parity2"),
    ]
}

/// A reference copy of a space's contents.
pub struct Model {
    pub bytes: Vec<u8>,
}

impl Model {
    pub fn new(size: u64) -> Model {
        Model {
            bytes: vec![0; size as usize],
        }
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        self.bytes[offset as usize..offset as usize + data.len()].copy_from_slice(data);
    }

    pub fn zero(&mut self, offset: u64, length: u64) {
        self.bytes[offset as usize..(offset + length) as usize].fill(0);
    }

    pub fn slice(&self, offset: u64, length: u64) -> &[u8] {
        &self.bytes[offset as usize..(offset + length) as usize]
    }

    /// Write `length` bytes from `rng` at `offset` of `space` (not FUA),
    /// and here.
    pub async fn write_random(
        &mut self,
        space: &terrace_engine::Space,
        rng: &mut SplitMix64,
        offset: u64,
        length: u64,
    ) {
        let data = rng.bytes(length as usize);
        space
            .write(offset, bytes(data.clone()), false)
            .await
            .unwrap();
        self.write(offset, &data);
    }

    /// `count` writes of ranges from [`random_range`] (up to `max` bytes)
    /// to `space`, and here.
    pub async fn write_random_ranges(
        &mut self,
        space: &terrace_engine::Space,
        rng: &mut SplitMix64,
        count: usize,
        max: u64,
    ) {
        for _ in 0..count {
            let (offset, length) = random_range(rng, space.size_bytes(), max);
            self.write_random(space, rng, offset, length).await;
        }
    }
}

/// A random (offset, length) within `size`, up to `max` bytes: block
/// aligned two times in three, any bytes otherwise.
pub fn random_range(rng: &mut SplitMix64, size: u64, max: u64) -> (u64, u64) {
    if rng.below(3) == 0 {
        let offset = rng.below(size);
        let length = 1 + rng.below(max);
        return (offset, length.min(size - offset));
    }
    let blocks = size / 4096;
    let offset = rng.below(blocks) * 4096;
    let length = (1 + rng.below(max / 4096)) * 4096;
    (offset, length.min(size - offset))
}

pub fn bytes(data: Vec<u8>) -> Bytes {
    Bytes::from(data)
}

/// Run `work` while the pool's job runner runs beside it.
pub async fn with_jobs<T>(pool: &Pool, work: impl std::future::Future<Output = T>) -> T {
    let runner = Box::pin(pool.run_jobs());
    match futures::future::select(runner, Box::pin(work)).await {
        futures::future::Either::Left(_) => panic!("the job runner stopped on its own"),
        futures::future::Either::Right((value, _)) => value,
    }
}

pub async fn sleep(milliseconds: u64) {
    env().sleep(milliseconds * 1_000_000).await;
}

/// Wait until no job is active; returns the final statuses.
pub async fn jobs_settle(pool: &Pool) -> Vec<terrace_engine::JobStatus> {
    use terrace_engine::meta::JobState;
    for _ in 0..3000 {
        let statuses = pool.job_statuses().await;
        if !statuses.is_empty()
            && statuses
                .iter()
                .all(|s| !matches!(s.state, JobState::Running | JobState::Paused))
        {
            return statuses;
        }
        sleep(5).await;
    }
    panic!("jobs did not finish: {:?}", pool.job_statuses().await);
}

/// `inner`'s write, once `wait` (if any) is released.
pub fn write_after(
    wait: Option<futures::channel::oneshot::Receiver<()>>,
    inner: &Arc<dyn BlockDevice>,
    offset: u64,
    data: Bytes,
    fua: bool,
) -> BoxFuture<IoResult<()>> {
    let Some(wait) = wait else {
        return inner.write(offset, data, fua);
    };
    let inner = inner.clone();
    Box::pin(async move {
        let _ = wait.await;
        inner.write(offset, data, fua).await
    })
}

/// The start of the one write [`MarkedHeld`] holds.
pub const MARK: [u8; 8] = *b"held!!!!";

/// The slabs of space `name`.
pub fn space_slabs(
    metadata: &terrace_engine::meta::PoolMetadata,
    name: &str,
) -> std::collections::BTreeSet<terrace_engine::meta::SlabRef> {
    let extents = metadata.space(name).unwrap().extents.iter();
    terrace_engine::meta::ExtentRecord::slabs_of(extents).collect()
}

/// `devices`, each behind a [`MarkedHeld`] with the gate `gate_of` gives
/// for its index.
pub fn marked_held(
    devices: &[Arc<dyn BlockDevice>],
    gate_of: impl Fn(usize) -> Arc<Gate>,
) -> Vec<Arc<dyn BlockDevice>> {
    devices
        .iter()
        .enumerate()
        .map(|(index, inner)| {
            let (inner, gate) = (inner.clone(), gate_of(index));
            Arc::new(MarkedHeld { inner, gate }) as Arc<dyn BlockDevice>
        })
        .collect()
}

/// Holds the first write of data starting with [`MARK`] at its gate, until
/// released.
pub struct MarkedHeld {
    pub inner: Arc<dyn BlockDevice>,
    pub gate: Arc<Gate>,
}

impl BlockDevice for MarkedHeld {
    terrace_io::forward_device_answers!(inner: name, size_bytes, alignment);

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        let wait = Some(())
            .filter(|_| data.starts_with(&MARK))
            .and_then(|_| self.gate.pass());
        write_after(wait, &self.inner, offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        self.inner.write_zeroes(offset, length, fua)
    }
    fn flush(&self) -> BoxFuture<IoResult<()>> {
        self.inner.flush()
    }
}

/// Holds the next request it is asked about (a read, or a write of a
/// log's zeroes) that reaches any device sharing it, until released.
#[derive(Default)]
pub struct Gate {
    armed: AtomicBool,
    held: AtomicBool,
    /// The device of the request held.
    pub held_at: std::sync::Mutex<Option<String>>,
    open: std::sync::Mutex<Option<futures::channel::oneshot::Sender<()>>>,
    wait: std::sync::Mutex<Option<futures::channel::oneshot::Receiver<()>>>,
}

impl Gate {
    pub fn arm(&self) {
        let (open, wait) = futures::channel::oneshot::channel();
        *self.open.lock().unwrap() = Some(open);
        *self.wait.lock().unwrap() = Some(wait);
        self.armed.store(true, Ordering::SeqCst);
    }

    pub fn holding(&self) -> bool {
        self.held.load(Ordering::SeqCst)
    }

    /// Whether a request is held, waiting up to 100 ms for one.
    pub async fn reached(&self) -> bool {
        for _ in 0..1000 {
            if self.holding() {
                return true;
            }
            env().sleep(100_000).await;
        }
        self.holding()
    }

    pub fn release(&self) {
        if let Some(open) = self.open.lock().unwrap().take() {
            let _ = open.send(());
        }
    }

    /// For a request arriving: what to wait for, if it is the one to hold.
    pub fn pass(&self) -> Option<futures::channel::oneshot::Receiver<()>> {
        if !self.armed.swap(false, Ordering::SeqCst) {
            return None;
        }
        self.held.store(true, Ordering::SeqCst);
        self.wait.lock().unwrap().take()
    }
}

/// Limit the pool's repairs, moves and resync after a crash to `rate`
/// bytes per second (0: none).
pub async fn set_repair_rate(pool: &Pool, rate: u64) {
    pool.set_settings(terrace_engine::meta::PoolSettings {
        repair_rate_bytes_per_second: rate,
        ..pool.metadata().await.settings
    })
    .await
    .unwrap();
}

/// Where row `row` of `slot` of `extent` of `space` lies: its disk and the
/// byte offset of the row's part on it.
pub async fn row_place(
    pool: &Pool,
    space: &terrace_engine::Space,
    extent: u64,
    row: u64,
    slot: u32,
) -> (usize, u64) {
    let metadata = pool.metadata().await;
    let slab = metadata.space(space.name()).unwrap().extents[extent as usize]
        .slabs
        .as_ref()
        .unwrap()[slot as usize];
    let offset = terrace_engine::meta::format::data_offset(METADATA_SLOT_MIN_BYTES)
        + u64::from(slab.slab.0) * SLAB
        + space.geometry().slab_offset(row, 0);
    (usize::from(slab.disk.0), offset)
}

/// Records the reads that reach a device, as (offset, length).
pub struct Recorded {
    pub inner: Arc<dyn BlockDevice>,
    pub reads: std::sync::Mutex<Vec<(u64, u64)>>,
}

impl Recorded {
    /// The reads recorded since the last call.
    pub fn take(&self) -> Vec<(u64, u64)> {
        std::mem::take(&mut self.reads.lock().unwrap())
    }
}

impl BlockDevice for Recorded {
    terrace_io::forward_device_answers!(inner: name, size_bytes, alignment);

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        self.reads.lock().unwrap().push((offset, buf.len() as u64));
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        self.inner.write(offset, data, fua)
    }
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        self.inner.write_zeroes(offset, length, fua)
    }
    fn flush(&self) -> BoxFuture<IoResult<()>> {
        self.inner.flush()
    }
}
