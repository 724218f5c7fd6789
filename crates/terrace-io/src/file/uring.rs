//! The io_uring engine: one ring per device, fed by the callers, reaped by
//! one reactor thread.
//!
//! ```text
//!  futures ──admit──▶ Ring::submit (caller's thread) ──SQE, enter──▶ kernel
//!     ▲                 slots[i] = Request (owns the buffer)            │
//!     │                                                                 │
//!     └── oneshot ◀── Request::complete ◀── reactor: reap CQE(i) ◀──────┘
//! ```
//!
//! A caller pushes its request's SQE and calls `io_uring_enter` itself, on
//! its own thread: the request reaches the kernel without a hand-over to
//! another thread, and the reactor is not woken to submit it (a thread
//! switch each way per round when it was). The SQ is shared by the callers
//! under the ring's lock; the kernel allows concurrent submitters on a ring
//! without `IORING_SETUP_SINGLE_ISSUER`. A thread whose own work is the
//! bottleneck (an NBD connection thread) can hand its writes and small
//! reads to the reactor to submit instead: [`hand_off_submissions`].
//!
//! The reactor sleeps in `io_uring_enter` waiting for at least one
//! completion, reaps, and answers the callers. A one-shot `POLL_ADD` on an
//! eventfd is always armed while the reactor runs; closing the device,
//! handing off a submission, or a caller's failed `io_uring_enter` signals
//! it, so the reactor wakes out of the kernel, submits the entries left to
//! it and sees whether the ring is closed. The poll owns no memory, so
//! nothing is at risk if the ring goes away with it still armed.
//!
//! # One ring per device
//!
//! Each [`super::FileDevice`] gets its own ring and reactor rather than all
//! devices sharing one. A shared ring would save threads, but its in-flight
//! bound would be shared too, so one slow or dying drive (whose requests sit
//! in the kernel for seconds of retries) could take every slot and stall I/O
//! to healthy drives; with a ring each, a drive only ever competes with
//! itself. It also keeps lifetimes simple: dropping the device stops and
//! joins exactly its reactor, with no global registry. The cost, one thread
//! per drive, is small for the tens of drives a pool holds.
//!
//! # Buffer safety
//!
//! An SQE carries raw pointers into the request's `BytesMut`/`Bytes`. The
//! request (and so the buffer) goes into `slots` before its SQE is pushed,
//! stays there until its CQE is reaped, and only then is completed and
//! dropped. Heap memory behind `BytesMut`/`Bytes` does not move when the
//! handle moves, and nothing resizes it while in flight. The reactor exits
//! only when the ring is closed (no SQE can be pushed any more) and no
//! request is left in `slots`. If the ring ever fails for good, requests the
//! kernel may still own are leaked on purpose rather than freed.

use std::cell::Cell;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use io_uring::{opcode, squeue, types, IoUring, Probe};

use super::queue::{Op, Queue, Request};
use super::sys;

/// Largest single transfer handed to the kernel. The SQE length field is 32
/// bits and Linux caps one read/write at about 2 GiB anyway; 1 GiB is a
/// multiple of every block size, so splitting keeps O_DIRECT alignment. The
/// callers loop over short transfers.
pub(crate) const MAX_TRANSFER: usize = 1 << 30;

/// `io_uring_enter` flag: wait for completions (include/uapi/linux/io_uring.h).
const IORING_ENTER_GETEVENTS: u32 = 1;

/// Marks the eventfd poll's completion; slot indices never reach it.
const WAKE_TOKEN: u64 = u64::MAX;

/// Set up a ring for `capacity` requests plus the wake-up poll and start its
/// reactor. Failing here (no io_uring in this kernel, or it is disabled) lets
/// the caller fall back to the thread engine.
pub(crate) fn start(file: Arc<File>, capacity: usize) -> io::Result<(Arc<Queue>, JoinHandle<()>)> {
    // Every admitted request plus the poll fits in the submission queue, so a
    // push cannot fail; the completion queue is twice as big, so it cannot
    // overflow either.
    let entries = u32::try_from((capacity + 1).next_power_of_two())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let ring = IoUring::new(entries)?;
    require_opcodes(&ring)?;
    let ring = Arc::new(Ring {
        ring,
        file,
        eventfd: sys::eventfd()?,
        state: Mutex::new(RingState {
            slots: Vec::new(),
            free_slots: Vec::new(),
            closed: false,
            wake_armed: false,
            unsubmitted: 0,
            wake_signalled: false,
        }),
    });
    let queue = Queue::new(capacity, Some(Arc::clone(&ring)));
    let mut reactor = Reactor {
        ring,
        queue: Arc::clone(&queue),
        reaped: Vec::new(),
    };
    let handle = std::thread::Builder::new()
        .name("terrace-io-uring".to_string())
        .spawn(move || reactor.run())?;
    Ok((queue, handle))
}

/// Kernels from 5.1 to 5.5 have io_uring but not every opcode used here.
fn require_opcodes(ring: &IoUring) -> io::Result<()> {
    let mut probe = Probe::new();
    ring.submitter().register_probe(&mut probe)?;
    let needed = [
        opcode::Read::CODE,
        opcode::Write::CODE,
        opcode::Fsync::CODE,
        opcode::Fallocate::CODE,
        opcode::PollAdd::CODE,
    ];
    if needed.iter().all(|&code| probe.is_supported(code)) {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP))
    }
}

/// A device's ring, shared by the callers (who submit) and the reactor (who
/// reaps).
pub(crate) struct Ring {
    ring: IoUring,
    /// Keeps the device fd open while requests against it are in the kernel.
    file: Arc<File>,
    /// Wakes the reactor out of `io_uring_enter` (close, failed submission).
    eventfd: OwnedFd,
    /// Guards the SQ as well: every push happens under this lock.
    state: Mutex<RingState>,
}

struct RingState {
    /// Requests whose SQE is in the ring, indexed by their `user_data`.
    slots: Vec<Option<Request>>,
    /// Indices of the empty entries of `slots`.
    free_slots: Vec<usize>,
    /// No more SQEs: set by [`Ring::close`] or when the ring failed.
    closed: bool,
    wake_armed: bool,
    /// Entries pushed that the reactor is to submit: handed off, or not
    /// taken by their caller's `io_uring_enter`.
    unsubmitted: u32,
    /// The eventfd was signalled since the reactor last took `unsubmitted`:
    /// it will wake and take them, so handing off more needs no further
    /// signal (one `write(2)` per reactor round, not per request).
    wake_signalled: bool,
}

/// Reads this large are submitted by their caller even on a thread that
/// hands its submissions off (see [`hand_off_submissions`]).
pub const DIRECT_READ_MIN_BYTES: usize = 64 << 10;

thread_local! {
    static HAND_OFF: Cell<bool> = const { Cell::new(false) };
}

/// From now on, requests started on this thread are submitted to the kernel
/// by their device's reactor thread instead of by this one, except reads of
/// [`DIRECT_READ_MIN_BYTES`] or more, which are still submitted here.
///
/// For a thread whose own work is the bottleneck, such as one reading a
/// connection's requests off a socket. Submitting a write to a file costs
/// the file system's and the block layer's work for it, which the reactor
/// can do on another CPU meanwhile; small reads come many at a time, and
/// the reactor submits a round of them with one system call where this
/// thread would make one each. A large read's submission costs less than
/// the thread switches there and back, so it stays on the caller's thread;
/// so do all requests of threads that do not hand off.
pub fn hand_off_submissions() {
    HAND_OFF.with(|hand_off| hand_off.set(true));
}

impl RingState {
    /// Requests whose SQE is in the ring (submitted or not yet).
    fn in_ring(&self) -> usize {
        self.slots.len() - self.free_slots.len()
    }
}

impl Ring {
    fn lock(&self) -> MutexGuard<'_, RingState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Put `request` into the ring and have the kernel start it: on the
    /// caller's thread, or, if the thread hands its submissions off (see
    /// [`hand_off_submissions`]), on the reactor's. A closed ring answers
    /// ENXIO at once.
    pub(crate) fn submit(&self, mut request: Request) {
        let hand_off = HAND_OFF.with(Cell::get)
            && !matches!(&request.op, Op::Read { buf, start, .. }
                if buf.len() - start >= DIRECT_READ_MIN_BYTES);
        let entry = entry_for(&self.file, &mut request.op);
        let signal = {
            let mut state = self.lock();
            if state.closed {
                drop(state);
                request.complete(Err(io::Error::from_raw_os_error(libc::ENXIO)));
                return;
            }
            let slot = state.free_slots.pop().unwrap_or_else(|| {
                state.slots.push(None);
                state.slots.len() - 1
            });
            // SAFETY: the SQ is only touched under `state`'s lock, which is
            // held. The buffer the entry points to belongs to the request,
            // which goes into `slots` and stays there until its completion
            // is reaped; the fd is kept open by `self.file`.
            let entry = entry.user_data(slot as u64);
            if unsafe { self.ring.submission_shared().push(&entry) }.is_err() {
                // Admission keeps the requests in the ring below the SQ's
                // size, so this is not expected; refuse rather than hang.
                state.free_slots.push(slot);
                drop(state);
                request.complete(Err(io::Error::from_raw_os_error(libc::EBUSY)));
                return;
            }
            state.slots[slot] = Some(request);
            if hand_off {
                state.unsubmitted += 1;
                // One signal per reactor round: the reactor takes every
                // handed-off entry when it wakes.
                !std::mem::replace(&mut state.wake_signalled, true)
            } else {
                false
            }
        };
        if hand_off {
            if signal {
                sys::eventfd_signal(self.eventfd.as_raw_fd());
            }
            return;
        }
        // Outside the lock: the kernel starts the I/O here, on this thread.
        // Every entry pushed carries one credit, spent by exactly one enter
        // after the push (its caller's, or the reactor's for the ones
        // handed off or not taken): as the kernel takes entries in order,
        // an enter never finds fewer entries than its credits, and every
        // entry is taken.
        self.spend(1);
    }

    /// Have the kernel take `credits` entries; what it does not take goes
    /// back to the reactor, which is woken to submit it (or to fail the
    /// ring, answering everyone).
    fn spend(&self, credits: u32) {
        let taken = match enter(&self.ring, credits, 0, 0) {
            Ok(taken) => (taken as u32).min(credits),
            Err(_) => 0,
        };
        if taken < credits {
            self.lock().unsubmitted += credits - taken;
            sys::eventfd_signal(self.eventfd.as_raw_fd());
        }
    }

    /// Refuse new requests; the reactor exits once the ring is empty.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        sys::eventfd_signal(self.eventfd.as_raw_fd());
    }
}

/// Build the SQE for `op`. The pointers inside point into memory owned by the
/// request, which stays in `slots` until the completion is reaped.
fn entry_for(file: &File, op: &mut Op) -> squeue::Entry {
    let fd = types::Fd(file.as_raw_fd());
    match op {
        Op::Read { buf, start, offset } => {
            let rest = &mut buf[*start..];
            let length = rest.len().min(MAX_TRANSFER) as u32;
            opcode::Read::new(fd, rest.as_mut_ptr(), length)
                .offset(*offset)
                .build()
        }
        Op::Write {
            data,
            offset,
            dsync,
        } => {
            let length = data.len().min(MAX_TRANSFER) as u32;
            let flags = if *dsync { libc::RWF_DSYNC } else { 0 };
            opcode::Write::new(fd, data.as_ptr(), length)
                .offset(*offset)
                .rw_flags(flags)
                .build()
        }
        Op::SyncData => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
        Op::Fallocate {
            mode,
            offset,
            length,
        } => opcode::Fallocate::new(fd, *length)
            .offset(*offset)
            .mode(*mode)
            .build(),
    }
}

struct Reactor {
    ring: Arc<Ring>,
    /// Closed with the ring when the ring fails, so admission stops too.
    queue: Arc<Queue>,
    /// Reaped requests and their results, answered outside the lock.
    reaped: Vec<(Request, i32)>,
}

impl Reactor {
    fn run(&mut self) {
        loop {
            let to_submit = {
                let mut state = self.ring.lock();
                if state.closed && state.in_ring() == 0 {
                    return;
                }
                // Armed after closing too: a caller whose enter failed still
                // needs the reactor to submit its entry, whose completion
                // the reactor then waits for before it exits.
                if !state.wake_armed {
                    let entry = opcode::PollAdd::new(
                        types::Fd(self.ring.eventfd.as_raw_fd()),
                        libc::POLLIN as u32,
                    )
                    .build()
                    .user_data(WAKE_TOKEN);
                    // SAFETY: under the lock; the poll points to no memory.
                    // The SQ has room for every admitted request plus it.
                    if unsafe { self.ring.ring.submission_shared().push(&entry) }.is_err() {
                        drop(state);
                        return self.fail(io::Error::from_raw_os_error(libc::EBUSY));
                    }
                    state.wake_armed = true;
                    state.unsubmitted += 1;
                }
                // Handed-off entries pushed from now on signal anew: none is
                // left waiting for a reactor that is not coming.
                state.wake_signalled = false;
                std::mem::take(&mut state.unsubmitted)
            };
            // Submits the poll and whatever callers failed to submit, then
            // sleeps until a completion arrives.
            match enter(&self.ring.ring, to_submit, 1, IORING_ENTER_GETEVENTS) {
                Ok(taken) if taken as u32 >= to_submit => {}
                Ok(taken) => self.ring.lock().unsubmitted += to_submit - taken as u32,
                // Interrupted, short of memory, or completions must be reaped
                // before more can be posted: reap and go round again.
                Err(error) if is_transient(&error) => {
                    self.ring.lock().unsubmitted += to_submit;
                }
                Err(error) => return self.fail(error),
            }
            self.reap();
        }
    }

    fn reap(&mut self) {
        {
            let mut state = self.ring.lock();
            // SAFETY: only the reactor reads the CQ.
            for entry in unsafe { self.ring.ring.completion_shared() } {
                let token = entry.user_data();
                if token == WAKE_TOKEN {
                    sys::eventfd_drain(self.ring.eventfd.as_raw_fd());
                    state.wake_armed = false;
                    continue;
                }
                let slot = token as usize;
                let Some(request) = state.slots.get_mut(slot).and_then(Option::take) else {
                    continue;
                };
                state.free_slots.push(slot);
                self.reaped.push((request, entry.result()));
            }
        }
        for (request, result) in self.reaped.drain(..) {
            let result = if result >= 0 {
                Ok(result as usize)
            } else {
                Err(io::Error::from_raw_os_error(-result))
            };
            request.complete(result);
        }
    }

    /// The ring is unusable. Refuse new work, answer everything with the
    /// error, and leak the buffers of requests the kernel may still hold: the
    /// caller gets the error without its buffer (it allocates a new one).
    fn fail(&mut self, error: io::Error) {
        let code = error.raw_os_error().unwrap_or(libc::EIO);
        let requests: Vec<Request> = {
            let mut state = self.ring.lock();
            state.closed = true;
            state.free_slots.clear();
            std::mem::take(&mut state.slots)
                .into_iter()
                .flatten()
                .collect()
        };
        self.queue.close();
        for mut request in requests {
            let op = std::mem::replace(&mut request.op, Op::SyncData);
            std::mem::forget(op);
            request.complete(Err(io::Error::from_raw_os_error(code)));
        }
    }
}

/// `io_uring_enter`: submit up to `to_submit` entries, then wait for
/// `min_complete` completions when `flags` asks for events.
fn enter(ring: &IoUring, to_submit: u32, min_complete: u32, flags: u32) -> io::Result<usize> {
    // SAFETY: no argument struct is passed.
    unsafe {
        ring.submitter()
            .enter::<libc::sigset_t>(to_submit, min_complete, flags, None)
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}
