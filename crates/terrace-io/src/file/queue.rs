//! The hand-over point between the futures of a [`super::FileDevice`] and the
//! engine that executes their system calls.
//!
//! ```text
//!   caller futures                 Queue                      engine
//!   ──────────────      ┌───────────────────────────┐     ─────────────
//!   run(op) ──admit──▶  │ free slots: N (bounded)   │
//!     │  (waits here    │ waiters: FIFO of wakers   │
//!     │   when N = 0)   │ pending: ops handed over  │ ──▶ worker threads
//!     ├──push──────────▶│   (thread engine)         │     (next_blocking)
//!     └──submit ────────┼──▶ io_uring: an SQE pushed by the caller's
//!        await reply ◀──┼─── oneshot: (op, result) ─┼──── complete()
//! ```
//!
//! A request holds a [`Permit`] (one slot) from the moment it is admitted
//! until the engine completes it, so `pending + executing ≤ capacity` at all
//! times: the queue can never grow without bound, and a caller that finds no
//! free slot waits asynchronously (backpressure) instead of allocating.
//!
//! Ownership is what keeps buffers safe: once handed over, the [`Op`] (and so
//! its `BytesMut`/`Bytes`) belongs to the request, which the engine drops only
//! after the system call or the kernel completion is over. If the caller's
//! future is dropped meanwhile, the reply is simply discarded with the buffer
//! in it; nothing the kernel might still touch is ever freed early.

use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use futures::channel::oneshot;

use super::uring::Ring;

/// One system call's worth of work, owning the memory it reads or writes.
pub(crate) enum Op {
    /// Fill `buf[start..]` from `offset`.
    Read {
        buf: BytesMut,
        start: usize,
        offset: u64,
    },
    /// Store `data` at `offset`; `dsync` makes it durable before completion.
    Write {
        data: Bytes,
        offset: u64,
        dsync: bool,
    },
    /// `fdatasync`.
    SyncData,
    /// `fallocate(mode, offset, length)`.
    Fallocate { mode: i32, offset: u64, length: u64 },
}

/// What the engine hands back: the op (with its buffer) and the syscall result.
pub(crate) struct Completion {
    pub op: Op,
    /// Bytes transferred (0 for sync/fallocate), or the OS error.
    pub result: io::Result<usize>,
}

/// An admitted op on its way through an engine.
pub(crate) struct Request {
    pub op: Op,
    reply: oneshot::Sender<Completion>,
    _permit: Permit,
}

impl Request {
    /// Deliver the result; the slot is freed when `self` is gone.
    pub fn complete(self, result: io::Result<usize>) {
        let Request { op, reply, _permit } = self;
        // The caller may have stopped waiting; then the op and its buffer are
        // dropped here, after the engine is done with them.
        let _ = reply.send(Completion { op, result });
    }
}

struct State {
    pending: VecDeque<Request>,
    free: usize,
    waiters: VecDeque<(u64, Waker)>,
    next_ticket: u64,
    closed: bool,
}

pub(crate) struct Queue {
    state: Mutex<State>,
    /// Worker threads sleep here while `pending` is empty.
    ready: Condvar,
    /// With the io_uring engine, the ring admitted requests are submitted to
    /// by their callers (`pending` is not used).
    ring: Option<Arc<Ring>>,
}

impl Queue {
    pub fn new(capacity: usize, ring: Option<Arc<Ring>>) -> Arc<Self> {
        Arc::new(Queue {
            state: Mutex::new(State {
                pending: VecDeque::new(),
                free: capacity,
                waiters: VecDeque::new(),
                next_ticket: 0,
                closed: false,
            }),
            ready: Condvar::new(),
            ring,
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Stop admitting new ops. Ops already admitted still run to completion;
    /// the engine exits once `pending` is empty and nothing is executing.
    pub fn close(&self) {
        let waiters = {
            let mut state = self.lock();
            state.closed = true;
            std::mem::take(&mut state.waiters)
        };
        for (_, waker) in waiters {
            waker.wake();
        }
        self.ready.notify_all();
        if let Some(ring) = &self.ring {
            ring.close();
        }
    }

    /// Run `op` through the engine. A closed queue returns the op at once with
    /// `ENXIO`; `Err` means the engine vanished without answering (the op and
    /// its buffer are then gone).
    pub async fn run(self: &Arc<Self>, op: Op) -> Result<Completion, oneshot::Canceled> {
        let admitted = Admit {
            queue: self,
            ticket: None,
            finished: false,
        }
        .await;
        let Some(permit) = admitted else {
            return Ok(Completion {
                op,
                result: Err(io::Error::from_raw_os_error(libc::ENXIO)),
            });
        };
        let (reply, answer) = oneshot::channel();
        let request = Request {
            op,
            reply,
            _permit: permit,
        };
        if let Some(ring) = &self.ring {
            // The ring refuses it (ENXIO) once closed, under its own lock.
            ring.submit(request);
            return answer.await;
        }
        {
            let mut state = self.lock();
            // Checked under the same lock the workers read `closed` with, so
            // a worker that saw the queue closed and drained never misses a
            // request pushed just before it exits.
            if state.closed {
                drop(state);
                let Request { op, .. } = request;
                return Ok(Completion {
                    op,
                    result: Err(io::Error::from_raw_os_error(libc::ENXIO)),
                });
            }
            state.pending.push_back(request);
        }
        self.ready.notify_one();
        answer.await
    }

    /// Worker threads: the next request, or `None` once closed and drained.
    pub fn next_blocking(&self) -> Option<Request> {
        let mut state = self.lock();
        loop {
            if let Some(request) = state.pending.pop_front() {
                return Some(request);
            }
            if state.closed {
                return None;
            }
            state = self.ready.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn release(&self) {
        let waiter = {
            let mut state = self.lock();
            state.free += 1;
            state.waiters.pop_front()
        };
        if let Some((_, waker)) = waiter {
            waker.wake();
        }
    }
}

/// One slot of a queue's capacity, returned when dropped.
pub(crate) struct Permit {
    queue: Arc<Queue>,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.queue.release();
    }
}

/// Waits for a free slot, first come first served. A waiter woken by a
/// released slot is popped from the list; if a newcomer takes the slot first,
/// the woken waiter goes back to the front, so it keeps its place.
struct Admit<'a> {
    queue: &'a Arc<Queue>,
    ticket: Option<u64>,
    finished: bool,
}

impl Future for Admit<'_> {
    type Output = Option<Permit>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let queue = self.queue;
        let mut state = queue.lock();
        let position = self
            .ticket
            .and_then(|ticket| state.waiters.iter().position(|(t, _)| *t == ticket));
        if state.closed || state.free > 0 {
            if let Some(position) = position {
                state.waiters.remove(position);
            }
            self.finished = true;
            if state.closed {
                return Poll::Ready(None);
            }
            state.free -= 1;
            return Poll::Ready(Some(Permit {
                queue: Arc::clone(queue),
            }));
        }
        let waker = cx.waker().clone();
        match (self.ticket, position) {
            (Some(_), Some(position)) => state.waiters[position].1 = waker,
            (Some(ticket), None) => state.waiters.push_front((ticket, waker)),
            (None, _) => {
                let ticket = state.next_ticket;
                state.next_ticket += 1;
                state.waiters.push_back((ticket, waker));
                self.ticket = Some(ticket);
            }
        }
        Poll::Pending
    }
}

impl Drop for Admit<'_> {
    fn drop(&mut self) {
        let (Some(ticket), false) = (self.ticket, self.finished) else {
            return;
        };
        let mut state = self.queue.lock();
        if let Some(position) = state.waiters.iter().position(|(t, _)| *t == ticket) {
            state.waiters.remove(position);
            return;
        }
        // We were woken for a free slot but are going away without taking
        // it: pass the wake-up on so the slot does not sit idle.
        if state.free > 0 {
            if let Some((_, waker)) = state.waiters.pop_front() {
                drop(state);
                waker.wake();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use futures::task::{waker, ArcWake};

    use super::*;

    struct CountingWaker(AtomicUsize);

    impl ArcWake for CountingWaker {
        fn wake_by_ref(arc_self: &Arc<Self>) {
            arc_self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// What a worker would take next: everything pushed so far.
    fn take_pending(queue: &Queue) -> (VecDeque<Request>, bool) {
        let mut state = queue.lock();
        (std::mem::take(&mut state.pending), state.closed)
    }

    type RunFuture<'a> = Pin<Box<dyn Future<Output = Result<Completion, oneshot::Canceled>> + 'a>>;

    fn poll_once(future: &mut RunFuture<'_>, counter: &Arc<CountingWaker>) -> bool {
        let waker = waker(Arc::clone(counter));
        let mut cx = Context::from_waker(&waker);
        future.as_mut().poll(&mut cx).is_ready()
    }

    #[test]
    fn admission_is_bounded_and_a_freed_slot_wakes_the_first_waiter() {
        let queue = Queue::new(2, None);
        let counters: Vec<_> = (0..4)
            .map(|_| Arc::new(CountingWaker(AtomicUsize::new(0))))
            .collect();
        let mut futures: Vec<RunFuture<'_>> = (0..4)
            .map(|_| Box::pin(queue.run(Op::SyncData)) as RunFuture<'_>)
            .collect();
        for (future, counter) in futures.iter_mut().zip(&counters) {
            assert!(!poll_once(future, counter));
        }
        let (batch, closed) = take_pending(&queue);
        assert_eq!((batch.len(), closed), (2, false), "only two were admitted");
        // The third in line gives up; its place passes to the fourth.
        drop(futures.remove(2));
        let mut batch = batch.into_iter();
        batch.next().unwrap().complete(Ok(0));
        assert_eq!(counters[3].0.load(Ordering::SeqCst), 1);
        assert!(
            poll_once(&mut futures[0], &counters[0]),
            "first got its answer"
        );
        assert!(!poll_once(&mut futures[2], &counters[3]));
        let (admitted, _) = take_pending(&queue);
        assert_eq!(admitted.len(), 1, "the fourth is admitted now");
        assert_eq!(queue.lock().free, 0);
        drop(admitted);
        assert_eq!(queue.lock().free, 1, "dropping a request frees its slot");
    }

    #[test]
    fn closing_answers_waiters_with_enxio() {
        let queue = Queue::new(1, None);
        let counter = Arc::new(CountingWaker(AtomicUsize::new(0)));
        let mut first: RunFuture<'_> = Box::pin(queue.run(Op::SyncData));
        let mut second: RunFuture<'_> = Box::pin(queue.run(Op::SyncData));
        assert!(!poll_once(&mut first, &counter));
        assert!(!poll_once(&mut second, &counter));
        queue.close();
        let waker = waker(Arc::clone(&counter));
        let mut cx = Context::from_waker(&waker);
        match second.as_mut().poll(&mut cx) {
            Poll::Ready(Ok(completion)) => {
                let code = completion.result.unwrap_err().raw_os_error();
                assert_eq!(code, Some(libc::ENXIO));
            }
            _ => panic!("a waiter must be answered once the queue is closed"),
        }
        // The admitted request is still delivered to the engine.
        let (batch, closed) = take_pending(&queue);
        assert_eq!((batch.len(), closed), (1, true));
    }
}
