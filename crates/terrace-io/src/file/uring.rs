//! The io_uring engine: one reactor thread per device owning one ring.
//!
//! ```text
//!  futures ─push─▶ Queue.pending ──take──▶ reactor thread ──SQE──▶ kernel
//!     ▲              │                       │  slots[i] = Request   │
//!     │          eventfd signal ──PollAdd──▶ │  (owns the buffer)    │
//!     │                                      ▼                       │
//!     └──── oneshot ◀── Request::complete ◀─ reap CQE(user_data=i) ◀─┘
//! ```
//!
//! The reactor sleeps in `io_uring_enter` waiting for at least one
//! completion. A one-shot `POLL_ADD` on the queue's eventfd is always armed
//! while the queue is open, so a submitter that pushes a request and signals
//! the eventfd wakes the reactor out of the kernel; the reactor then drains
//! the eventfd, moves the pending requests into the ring and re-arms the poll.
//! The poll owns no memory, so nothing is at risk if the ring goes away with
//! it still armed.
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
//! request (and so the buffer) stays in `slots` until its CQE is reaped, and
//! only then is completed and dropped. Heap memory behind `BytesMut`/`Bytes`
//! does not move when the handle moves, and nothing resizes it while in
//! flight. If the ring ever fails for good, requests the kernel may still own
//! are leaked on purpose rather than freed.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::thread::JoinHandle;

use io_uring::{opcode, squeue, types, IoUring, Probe};

use super::queue::{Op, Queue, Request};
use super::sys;

/// Largest single transfer handed to the kernel. The SQE length field is 32
/// bits and Linux caps one read/write at about 2 GiB anyway; 1 GiB is a
/// multiple of every block size, so splitting keeps O_DIRECT alignment. The
/// callers loop over short transfers.
pub(crate) const MAX_TRANSFER: usize = 1 << 30;

/// Marks the eventfd poll's completion; slot indices never reach it.
const WAKE_TOKEN: u64 = u64::MAX;

/// Set up a ring for `capacity` requests plus the wake-up poll and start its
/// reactor. Failing here (no io_uring in this kernel, or it is disabled) lets
/// the caller fall back to the thread engine.
pub(crate) fn start(file: Arc<File>, capacity: usize) -> io::Result<(Arc<Queue>, JoinHandle<()>)> {
    // Every admitted request plus the poll fits in the submission queue, so a
    // push can only fail transiently; the completion queue is twice as big,
    // so it cannot overflow either.
    let entries = u32::try_from((capacity + 1).next_power_of_two())
        .map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let ring = IoUring::new(entries)?;
    require_opcodes(&ring)?;
    let queue = Queue::new(capacity, Some(sys::eventfd()?));
    let eventfd = match queue.eventfd() {
        Some(fd) => fd.as_raw_fd(),
        None => return Err(io::Error::from_raw_os_error(libc::EINVAL)),
    };
    let mut reactor = Reactor {
        ring,
        file,
        queue: Arc::clone(&queue),
        eventfd,
        slots: Vec::new(),
        free_slots: Vec::new(),
        in_kernel: 0,
        wake_armed: false,
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

struct Reactor {
    ring: IoUring,
    /// Keeps the device fd open while requests against it are in the kernel.
    file: Arc<File>,
    queue: Arc<Queue>,
    /// Owned by `queue`, which this reactor holds.
    eventfd: RawFd,
    /// Requests the kernel is working on, indexed by their `user_data`.
    slots: Vec<Option<Request>>,
    free_slots: Vec<usize>,
    in_kernel: usize,
    wake_armed: bool,
}

impl Reactor {
    fn run(&mut self) {
        loop {
            let (batch, closed) = self.queue.take_pending();
            if let Err(error) = self.submit_batch(batch) {
                return self.fail(error);
            }
            if !closed && !self.wake_armed {
                if let Err(error) = self.arm_wake() {
                    return self.fail(error);
                }
            }
            if closed && self.in_kernel == 0 {
                return;
            }
            match self.ring.submit_and_wait(1) {
                Ok(_) => {}
                // Interrupted, short of memory, or completions must be reaped
                // before more can be posted: reap and go round again.
                Err(error) if is_transient(&error) => {}
                Err(error) => return self.fail(error),
            }
            self.reap();
        }
    }

    fn submit_batch(&mut self, batch: VecDeque<Request>) -> io::Result<()> {
        let mut batch = batch.into_iter();
        while let Some(mut request) = batch.next() {
            let entry = self.entry_for(&mut request.op);
            let slot = self.free_slots.pop().unwrap_or_else(|| {
                self.slots.push(None);
                self.slots.len() - 1
            });
            let entry = entry.user_data(slot as u64);
            self.slots[slot] = Some(request);
            self.in_kernel += 1;
            if let Err(error) = self.push(&entry) {
                self.in_kernel -= 1;
                self.free_slots.push(slot);
                // Neither this request nor the rest reached the kernel, so
                // their buffers can go back to their callers.
                let code = error.raw_os_error().unwrap_or(libc::EIO);
                for request in self.slots[slot].take().into_iter().chain(batch) {
                    request.complete(Err(io::Error::from_raw_os_error(code)));
                }
                return Err(error);
            }
        }
        Ok(())
    }

    /// Build the SQE for `op`. The pointers inside point into memory owned by
    /// the request, which stays in `slots` until the completion is reaped.
    fn entry_for(&self, op: &mut Op) -> squeue::Entry {
        let fd = types::Fd(self.file.as_raw_fd());
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

    /// Queue one SQE, submitting what is queued if the ring is full.
    fn push(&mut self, entry: &squeue::Entry) -> io::Result<()> {
        for _ in 0..2 {
            // SAFETY: every buffer an entry points to is owned by a request
            // held in `self.slots` (or, for the wake poll, there is none) and
            // lives until its completion is reaped; the fd is kept open by
            // `self.file` / `self.queue`.
            if unsafe { self.ring.submission().push(entry) }.is_ok() {
                return Ok(());
            }
            match self.ring.submit() {
                Ok(_) => {}
                Err(error) if is_transient(&error) => self.reap(),
                Err(error) => return Err(error),
            }
        }
        Err(io::Error::from_raw_os_error(libc::EBUSY))
    }

    fn arm_wake(&mut self) -> io::Result<()> {
        let entry = opcode::PollAdd::new(types::Fd(self.eventfd), libc::POLLIN as u32)
            .build()
            .user_data(WAKE_TOKEN);
        self.push(&entry)?;
        self.wake_armed = true;
        Ok(())
    }

    fn reap(&mut self) {
        for entry in self.ring.completion() {
            let token = entry.user_data();
            if token == WAKE_TOKEN {
                sys::eventfd_drain(self.eventfd);
                self.wake_armed = false;
                continue;
            }
            let slot = token as usize;
            let Some(request) = self.slots.get_mut(slot).and_then(Option::take) else {
                continue;
            };
            self.free_slots.push(slot);
            self.in_kernel -= 1;
            let result = entry.result();
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
        self.queue.close();
        let code = error.raw_os_error().unwrap_or(libc::EIO);
        for slot in self.slots.iter_mut() {
            if let Some(mut request) = slot.take() {
                let op = std::mem::replace(&mut request.op, Op::SyncData);
                std::mem::forget(op);
                request.complete(Err(io::Error::from_raw_os_error(code)));
            }
        }
        loop {
            let (batch, _) = self.queue.take_pending();
            if batch.is_empty() {
                break;
            }
            for request in batch {
                request.complete(Err(io::Error::from_raw_os_error(code)));
            }
        }
    }
}

fn is_transient(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
    )
}
