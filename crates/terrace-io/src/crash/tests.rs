use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};

use futures::executor::block_on;
use futures::task::noop_waker_ref;
use proptest::prelude::*;

use super::*;
use crate::memory::MemoryDevice;

const SECTOR: usize = SECTOR_SIZE as usize;

fn setup(sectors: usize) -> (Arc<MemoryDevice>, CrashDevice) {
    let memory = Arc::new(MemoryDevice::new("memory:0", (sectors * SECTOR) as u64));
    let device = CrashDevice::new(memory.clone());
    (memory, device)
}

fn write(device: &CrashDevice, offset: u64, byte: u8, length: usize, fua: bool) {
    block_on(device.write(offset, Bytes::from(vec![byte; length]), fua)).unwrap();
}

/// A chooser that always answers `value` (0 landed, 1 dropped, 2 torn).
fn always(value: u64) -> impl FnMut() -> u64 {
    move || value
}

/// A deterministic pseudo-random chooser (xorshift64*).
fn seeded(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

#[test]
fn flushed_data_survives_every_crash() {
    for seed in 0..50 {
        let (memory, device) = setup(16);
        write(&device, 0, 1, 8 * SECTOR, false);
        block_on(device.flush()).unwrap();
        assert_eq!(device.volatile_writes(), 0);
        // Later volatile writes over part of it, which a crash may undo.
        write(&device, 2 * SECTOR as u64, 2, 2 * SECTOR, false);
        write(&device, 12 * SECTOR as u64, 3, SECTOR, false);
        device.crash(&mut seeded(seed)).unwrap();
        let image = memory.snapshot();
        for sector in 0..8 {
            let byte = image[sector * SECTOR];
            let allowed = if (2..4).contains(&sector) {
                [1, 2]
            } else {
                [1, 1]
            };
            assert!(
                allowed.contains(&byte),
                "seed {seed} sector {sector}: {byte}"
            );
        }
        // With every write dropped, exactly the flushed image remains.
        let (memory, device) = setup(16);
        write(&device, 0, 1, 8 * SECTOR, false);
        block_on(device.flush()).unwrap();
        write(&device, 0, 2, 16 * SECTOR, false);
        device.crash(&mut always(1)).unwrap();
        let image = memory.snapshot();
        assert!(image[..8 * SECTOR].iter().all(|&b| b == 1));
        assert!(image[8 * SECTOR..].iter().all(|&b| b == 0));
    }
}

#[test]
fn fua_data_survives_even_when_older_writes_are_dropped() {
    let (memory, device) = setup(16);
    write(&device, 0, 1, 8 * SECTOR, false);
    write(&device, 2 * SECTOR as u64, 2, 2 * SECTOR, true);
    write(&device, 8 * SECTOR as u64, 3, SECTOR, true);
    assert_eq!(device.volatile_writes(), 1, "FUA writes are not volatile");
    let report = device.crash(&mut always(1)).unwrap();
    assert_eq!(
        report,
        CrashReport {
            landed: 0,
            dropped: 1,
            torn: 0
        }
    );
    let image = memory.snapshot();
    assert!(image[..2 * SECTOR].iter().all(|&b| b == 0), "dropped");
    assert!(
        image[2 * SECTOR..4 * SECTOR].iter().all(|&b| b == 2),
        "FUA kept"
    );
    assert!(
        image[4 * SECTOR..8 * SECTOR].iter().all(|&b| b == 0),
        "dropped"
    );
    assert!(
        image[8 * SECTOR..9 * SECTOR].iter().all(|&b| b == 3),
        "FUA kept"
    );
}

/// Holds writes (not reads or flushes) while `held` is set, to keep a write
/// in flight across a flush.
struct Gate {
    inner: Arc<MemoryDevice>,
    held: Arc<AtomicBool>,
}

struct HeldWrite {
    held: Arc<AtomicBool>,
    write: BoxFuture<IoResult<()>>,
}

impl Future for HeldWrite {
    type Output = IoResult<()>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        if self.held.load(Ordering::SeqCst) {
            return Poll::Pending; // the test polls again by hand
        }
        self.write.as_mut().poll(cx)
    }
}

impl BlockDevice for Gate {
    crate::forward_device_answers!(inner: name, size_bytes);

    fn alignment(&self) -> u64 {
        1
    }
    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        Box::pin(HeldWrite {
            held: self.held.clone(),
            write: self.inner.write(offset, data, fua),
        })
    }
    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        self.inner.write_zeroes(offset, length, fua)
    }
    fn flush(&self) -> BoxFuture<IoResult<()>> {
        self.inner.flush()
    }
}

fn poll<T>(future: &mut BoxFuture<T>) -> Poll<T> {
    future
        .as_mut()
        .poll(&mut Context::from_waker(noop_waker_ref()))
}

#[test]
fn writes_in_flight_or_completed_after_a_flush_is_issued_stay_volatile() {
    let memory = Arc::new(MemoryDevice::new("memory:0", 16 * SECTOR as u64));
    let held = Arc::new(AtomicBool::new(false));
    let gate = Arc::new(Gate {
        inner: memory.clone(),
        held: held.clone(),
    });
    let device = CrashDevice::new(gate);
    write(&device, 0, 1, SECTOR, false); // completes before the flush
    held.store(true, Ordering::SeqCst);
    let mut in_flight = device.write(SECTOR as u64, Bytes::from(vec![2u8; SECTOR]), false);
    assert!(poll(&mut in_flight).is_pending());
    let mut flush = device.flush(); // issued now
    held.store(false, Ordering::SeqCst);
    assert!(matches!(poll(&mut in_flight), Poll::Ready(Ok(()))));
    // Completed after the flush was issued, before it completed.
    write(&device, 2 * SECTOR as u64, 3, SECTOR, false);
    assert!(matches!(poll(&mut flush), Poll::Ready(Ok(()))));
    assert_eq!(device.volatile_writes(), 2);
    let report = device.crash(&mut always(1)).unwrap();
    assert_eq!(report.dropped, 2);
    let image = memory.snapshot();
    assert!(
        image[..SECTOR].iter().all(|&b| b == 1),
        "flushed write kept"
    );
    assert!(
        image[SECTOR..3 * SECTOR].iter().all(|&b| b == 0),
        "both lost"
    );
}

#[test]
fn crash_refuses_to_run_while_a_write_is_in_flight() {
    let memory = Arc::new(MemoryDevice::new("memory:0", 4 * SECTOR as u64));
    let held = Arc::new(AtomicBool::new(true));
    let gate = Arc::new(Gate {
        inner: memory,
        held: held.clone(),
    });
    let device = CrashDevice::new(gate);
    let mut in_flight = device.write(0, Bytes::from(vec![2u8; SECTOR]), false);
    assert!(poll(&mut in_flight).is_pending());
    let error = device.crash(&mut always(0)).unwrap_err();
    assert!(error.to_string().contains("in flight"), "{error}");
    held.store(false, Ordering::SeqCst);
    assert!(poll(&mut in_flight).is_ready());
    assert_eq!(device.crash(&mut always(0)).unwrap().landed, 1);
}

#[test]
fn reports_add_up_and_torn_writes_mix_sectors() {
    let (memory, device) = setup(16);
    write(&device, 0, 1, 4 * SECTOR, false);
    write(&device, 4 * SECTOR as u64, 2, 4 * SECTOR, false);
    write(&device, 8 * SECTOR as u64, 3, 4 * SECTOR, false);
    block_on(device.write_zeroes(12 * SECTOR as u64, SECTOR as u64, false)).unwrap();
    assert_eq!(device.volatile_writes(), 4);
    // Newest first: the zeroes land, the third write tears (sectors keep,
    // restore, keep, restore), the second drops, the first lands.
    let mut answers = [0, 2, 1, 0, 1, 0, 1, 0].into_iter();
    let report = device.crash(&mut || answers.next().unwrap()).unwrap();
    assert_eq!(
        report,
        CrashReport {
            landed: 2,
            dropped: 1,
            torn: 1
        }
    );
    assert_eq!(report.total(), 4);
    assert_eq!(device.volatile_writes(), 0);
    let image = memory.snapshot();
    let sector = |index: usize| image[index * SECTOR];
    assert_eq!((0..4).map(sector).collect::<Vec<_>>(), [1, 1, 1, 1]);
    assert_eq!((4..8).map(sector).collect::<Vec<_>>(), [0, 0, 0, 0]);
    assert_eq!((8..12).map(sector).collect::<Vec<_>>(), [3, 0, 3, 0]);
    // The device is usable afterwards, and a second crash has nothing to do.
    write(&device, 0, 9, SECTOR, false);
    assert_eq!(device.volatile_writes(), 1);
    block_on(device.flush()).unwrap();
    assert_eq!(
        device.crash(&mut always(1)).unwrap(),
        CrashReport::default()
    );
    assert_eq!(memory.read_sync(0, 1), vec![9]);
}

#[test]
fn a_newer_kept_write_is_not_undone_by_an_older_dropped_one() {
    let (memory, device) = setup(4);
    write(&device, 0, 1, 2 * SECTOR, false);
    write(&device, 0, 2, SECTOR, false);
    // Newest (byte 2) lands, older (byte 1) drops.
    let mut answers = [0, 1].into_iter();
    device.crash(&mut || answers.next().unwrap()).unwrap();
    assert_eq!(memory.read_sync(0, 1), vec![2], "newest kept write wins");
    assert_eq!(
        memory.read_sync(SECTOR as u64, 1),
        vec![0],
        "older one dropped"
    );
}

#[test]
fn out_of_range_writes_fail_and_leave_no_record() {
    let (_, device) = setup(4);
    let error = block_on(device.write(4 * SECTOR as u64, Bytes::from_static(b"x"), false));
    assert!(matches!(error, Err(IoError::OutOfRange { .. })));
    assert_eq!(device.volatile_writes(), 0);
}

/// One step of the property test.
#[derive(Debug, Clone)]
enum Step {
    Write {
        offset: u64,
        length: usize,
        fua: bool,
    },
    Zeroes {
        offset: u64,
        length: u64,
        fua: bool,
    },
    Flush,
    Crash {
        seed: u64,
    },
}

const MODEL_SECTORS: usize = 12;
const MODEL_SIZE: u64 = (MODEL_SECTORS * SECTOR) as u64;

fn step() -> impl Strategy<Value = Step> {
    let extent = (0..MODEL_SIZE).prop_flat_map(|offset| {
        (
            Just(offset),
            1..=(MODEL_SIZE - offset).min(3 * SECTOR as u64),
        )
    });
    prop_oneof![
        4 => (extent.clone(), any::<bool>()).prop_map(|((offset, length), fua)| Step::Write { offset, length: length as usize, fua }),
        1 => (extent, any::<bool>()).prop_map(|((offset, length), fua)| Step::Zeroes { offset, length, fua }),
        1 => Just(Step::Flush),
        1 => any::<u64>().prop_map(|seed| Step::Crash { seed }),
    ]
}

/// Per sector: the durable content and every content it has had since.
struct Model {
    live: Vec<u8>,
    durable: Vec<Vec<u8>>,
    since: Vec<Vec<Vec<u8>>>,
}

impl Model {
    fn new() -> Self {
        Model {
            live: vec![0; MODEL_SIZE as usize],
            durable: vec![vec![0; SECTOR]; MODEL_SECTORS],
            since: vec![Vec::new(); MODEL_SECTORS],
        }
    }

    fn sector(&self, index: usize) -> Vec<u8> {
        self.live[index * SECTOR..(index + 1) * SECTOR].to_vec()
    }

    fn apply(&mut self, offset: u64, bytes: &[u8], fua: bool) {
        let start = offset as usize;
        self.live[start..start + bytes.len()].copy_from_slice(bytes);
        for index in start / SECTOR..(start + bytes.len()).div_ceil(SECTOR) {
            let content = self.sector(index);
            if fua {
                self.durable[index] = content;
                self.since[index].clear();
            } else {
                self.since[index].push(content);
            }
        }
    }

    fn everything_durable(&mut self) {
        for index in 0..MODEL_SECTORS {
            self.durable[index] = self.sector(index);
            self.since[index].clear();
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_sector_after_a_crash_is_a_state_it_really_had(steps in prop::collection::vec(step(), 1..40)) {
        let (memory, device) = setup(MODEL_SECTORS);
        let mut model = Model::new();
        for (number, step) in steps.into_iter().enumerate() {
            match step {
                Step::Write { offset, length, fua } => {
                    // Distinct bytes per write and position, so contents identify writes.
                    let bytes: Vec<u8> = (0..length).map(|i| (number * 7 + i % 5 + 1) as u8).collect();
                    block_on(device.write(offset, Bytes::from(bytes.clone()), fua)).unwrap();
                    model.apply(offset, &bytes, fua);
                }
                Step::Zeroes { offset, length, fua } => {
                    block_on(device.write_zeroes(offset, length, fua)).unwrap();
                    model.apply(offset, &vec![0; length as usize], fua);
                }
                Step::Flush => {
                    block_on(device.flush()).unwrap();
                    model.everything_durable();
                }
                Step::Crash { seed } => {
                    let volatile = device.volatile_writes();
                    let report = device.crash(&mut seeded(seed)).unwrap();
                    prop_assert_eq!(report.total(), volatile);
                    prop_assert_eq!(device.volatile_writes(), 0);
                    model.live = memory.snapshot();
                    for index in 0..MODEL_SECTORS {
                        let actual = model.sector(index);
                        prop_assert!(
                            actual == model.durable[index] || model.since[index].contains(&actual),
                            "sector {} holds content it never had", index
                        );
                    }
                    model.everything_durable();
                }
            }
            prop_assert_eq!(&memory.snapshot(), &model.live, "the live image is the inner device");
        }
    }
}
