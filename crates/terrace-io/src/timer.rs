//! The timer behind [`SystemEnv::sleep`](crate::SystemEnv): drive models
//! sleep once per request, so a sleep must cost little.
//!
//! Two kinds of timer keep the sleeps, each a heap of deadlines under a
//! lock:
//!
//! * **A thread's own timer**, on threads that opted in with
//!   [`use_thread_timers`] and run a tokio runtime (the daemon's connection
//!   threads and its runtime's workers). It is a `timerfd` in that
//!   runtime's event loop, armed for its earliest deadline. When it fires,
//!   the thread that waits in that loop wakes the sleeps that are due
//!   itself: the tasks they belong to mostly run on that same thread, so a
//!   modelled request ends with one wake-up of the thread that goes on
//!   with it, and none if that thread is busy anyway. A timerfd expires
//!   when it is set to, with no timer slack.
//! * **One timer thread** for every other thread (tests, plain threads,
//!   `block_on`). It sleeps towards its earliest deadline, with a timer
//!   slack of 1 µs instead of the default 50 µs, wakes every sleep that is
//!   due and sleeps again. Ending a sleep so costs two thread wake-ups:
//!   the timer thread's and then the sleeper's.
//!
//! A new sleep arms its timer again only if it is due before the deadline
//! the timer is armed for (a device's requests mostly finish in the order
//! they were queued, so that is rare). A sleep dropped before its deadline
//! takes its waker back, so a timer never wakes a task for a sleep it gave
//! up; its heap entry is discarded when due. When a runtime shuts down, its
//! threads' timers hand the sleeps they still hold to the timer thread, so
//! a sleep polled again elsewhere still ends.

use std::cell::{Cell, RefCell};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::future::Future;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Timer slack of the timer thread: how late the kernel may wake it.
const SLACK_NS: libc::c_ulong = 1_000;

thread_local! {
    static THREAD_TIMERS: Cell<bool> = const { Cell::new(false) };
    static THREAD_TIMER: RefCell<Option<Arc<ThreadTimer>>> = const { RefCell::new(None) };
}

/// From now on, sleeps first polled on this thread while it is inside a
/// tokio runtime are kept by a timer of this thread's own, in the
/// runtime's event loop, instead of by the shared timer thread (see the
/// module's documentation).
///
/// For threads that run a runtime's event loop, such as a runtime's
/// workers or a thread that serves connections on a current-thread
/// runtime. A thread that blocks outside the runtime while its sleeps are
/// due would hold them up: such threads keep the timer thread.
pub fn use_thread_timers() {
    THREAD_TIMERS.with(|flag| flag.set(true));
}

/// A future that completes at `deadline`.
pub(crate) struct Sleep {
    deadline: Instant,
    entry: Option<Arc<Entry>>,
}

pub(crate) fn sleep_until(deadline: Instant) -> Sleep {
    Sleep {
        deadline,
        entry: None,
    }
}

/// What a sleep and its timer share.
#[derive(Default)]
struct Entry {
    fired: AtomicBool,
    waker: AtomicWaker,
}

impl Future for Sleep {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match &self.entry {
            Some(entry) => {
                if entry.fired.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                entry.waker.register(cx.waker());
                // Fired between the check and the registration: the timer
                // may have found no waker to wake.
                if entry.fired.load(Ordering::Acquire) {
                    return Poll::Ready(());
                }
                Poll::Pending
            }
            None => {
                if Instant::now() >= self.deadline {
                    return Poll::Ready(());
                }
                let entry = Arc::new(Entry::default());
                entry.waker.register(cx.waker());
                insert(Pending {
                    deadline: self.deadline,
                    entry: Arc::clone(&entry),
                });
                self.entry = Some(entry);
                Poll::Pending
            }
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(entry) = &self.entry {
            entry.waker.take();
        }
    }
}

/// A sleep in a heap, earliest deadline first. Sleeps with one deadline
/// need no order among them: a timer wakes every sleep that is due at
/// once.
struct Pending {
    deadline: Instant,
    entry: Arc<Entry>,
}

impl PartialEq for Pending {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == CmpOrdering::Equal
    }
}

impl Eq for Pending {}

impl PartialOrd for Pending {
    fn partial_cmp(&self, other: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(other))
    }
}

impl Ord for Pending {
    fn cmp(&self, other: &Self) -> CmpOrdering {
        // BinaryHeap is a max-heap: the earliest deadline is the greatest.
        other.deadline.cmp(&self.deadline)
    }
}

/// Move the sleeps of `heap` that are due at `now` to `due`.
fn take_due(heap: &mut BinaryHeap<Pending>, now: Instant, due: &mut Vec<Arc<Entry>>) {
    while heap.peek().is_some_and(|top| top.deadline <= now) {
        due.extend(heap.pop().map(|pending| pending.entry));
    }
}

/// End the sleeps in `due` (outside any timer's lock: a waker may run code).
fn fire(due: &mut Vec<Arc<Entry>>) {
    for entry in due.drain(..) {
        entry.fired.store(true, Ordering::Release);
        entry.waker.wake();
    }
}

/// Give `pending` to this thread's own timer if it has one (or can start
/// one), else to the timer thread.
fn insert(mut pending: Pending) {
    if THREAD_TIMERS.with(Cell::get) {
        // Twice at most: a timer whose runtime is gone is replaced once.
        for _ in 0..2 {
            let Some(timer) = ThreadTimer::current() else {
                break;
            };
            match timer.insert(pending) {
                Ok(()) => return,
                Err(back) => {
                    pending = back;
                    THREAD_TIMER.with(|slot| slot.borrow_mut().take());
                }
            }
        }
    }
    timer_thread().insert(pending);
}

/// A thread's own timer: a timerfd in its runtime's event loop, read by a
/// task of that runtime.
struct ThreadTimer {
    state: Mutex<ThreadState>,
    fd: AsyncFd<OwnedFd>,
}

struct ThreadState {
    heap: BinaryHeap<Pending>,
    /// The deadline the timerfd is armed for, if it is.
    armed: Option<Instant>,
    /// The task that reads the timerfd is gone (its runtime shut down): the
    /// heap was handed to the timer thread and nothing more goes in.
    closed: bool,
}

impl ThreadTimer {
    /// This thread's timer, started on first use; `None` outside a runtime
    /// whose event loop can take the timerfd.
    fn current() -> Option<Arc<ThreadTimer>> {
        THREAD_TIMER.with(|slot| {
            let mut slot = slot.borrow_mut();
            if slot.is_none() {
                *slot = ThreadTimer::start().ok();
            }
            slot.clone()
        })
    }

    fn start() -> io::Result<Arc<ThreadTimer>> {
        let runtime = tokio::runtime::Handle::try_current().map_err(io::Error::other)?;
        // SAFETY: plain system call; the new descriptor is owned below.
        let fd = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // A runtime built without its I/O driver panics here rather than
        // fail: that thread keeps the timer thread.
        let fd = std::panic::catch_unwind(|| {
            // SAFETY: the `OwnedFd` keeps its descriptor open, unchanged,
            // until the `AsyncFd` that owns it is dropped.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
        })
        .map_err(|_| io::Error::other("the runtime has no I/O driver"))?
        .map_err(io::Error::from)?;
        let timer = Arc::new(ThreadTimer {
            state: Mutex::new(ThreadState {
                heap: BinaryHeap::new(),
                armed: None,
                closed: false,
            }),
            fd,
        });
        runtime.spawn(Reader(Arc::clone(&timer)).run());
        Ok(timer)
    }

    fn lock(&self) -> MutexGuard<'_, ThreadState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keep `pending`, or give it back if this timer has closed.
    fn insert(&self, pending: Pending) -> Result<(), Pending> {
        let mut state = self.lock();
        if state.closed {
            return Err(pending);
        }
        let deadline = pending.deadline;
        state.heap.push(pending);
        if state.armed.is_none_or(|armed| deadline < armed) {
            self.arm(deadline);
            state.armed = Some(deadline);
        }
        Ok(())
    }

    /// Set the timerfd to expire at `deadline` (under the state's lock).
    fn arm(&self, deadline: Instant) {
        // Relative to now: `Instant` is CLOCK_MONOTONIC but does not show
        // its value. At least 1 ns, since zero would disarm the timerfd.
        let after = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_nanos(1));
        let value = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            it_value: libc::timespec {
                tv_sec: after.as_secs() as libc::time_t,
                tv_nsec: after.subsec_nanos() as libc::c_long,
            },
        };
        // SAFETY: the descriptor is open for as long as `self`; the
        // pointers are to locals. It cannot fail on a valid timerfd with a
        // valid value, which both are.
        unsafe {
            libc::timerfd_settime(
                self.fd.get_ref().as_raw_fd(),
                0,
                &value,
                std::ptr::null_mut(),
            )
        };
    }
}

/// The task that reads a thread timer's timerfd. Dropped with its runtime
/// (or when the event loop fails), even unpolled, it hands the timer's
/// sleeps to the timer thread.
struct Reader(Arc<ThreadTimer>);

impl Reader {
    /// On each expiry, end the sleeps that are due and arm the timerfd for
    /// the next.
    async fn run(self) {
        let timer = &self.0;
        let mut due = Vec::new();
        loop {
            let Ok(mut ready) = timer.fd.readable().await else {
                return;
            };
            let read = ready.try_io(|fd| {
                let mut expirations = 0u64;
                // SAFETY: reads 8 bytes into a local of 8 bytes.
                let count = unsafe {
                    libc::read(
                        fd.get_ref().as_raw_fd(),
                        (&raw mut expirations).cast(),
                        std::mem::size_of::<u64>(),
                    )
                };
                if count < 0 {
                    Err(io::Error::last_os_error())
                } else {
                    Ok(())
                }
            });
            if read.is_err() {
                // Not expired after all: readiness is cleared, wait again.
                continue;
            }
            {
                let mut state = timer.lock();
                let now = Instant::now();
                take_due(&mut state.heap, now, &mut due);
                state.armed = state.heap.peek().map(|top| top.deadline);
                if let Some(next) = state.armed {
                    timer.arm(next);
                }
            }
            fire(&mut due);
        }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let heap = {
            let mut state = self.0.lock();
            state.closed = true;
            std::mem::take(&mut state.heap)
        };
        for pending in heap {
            timer_thread().insert(pending);
        }
    }
}

struct State {
    heap: BinaryHeap<Pending>,
    /// The deadline the thread sleeps towards (`None`: it is awake, and
    /// looks at the heap before it sleeps again).
    sleeping_until: Option<Instant>,
}

/// The timer thread's timer.
struct Timer {
    state: Mutex<State>,
    wake: Condvar,
}

fn timer_thread() -> &'static Timer {
    static TIMER: OnceLock<&'static Timer> = OnceLock::new();
    TIMER.get_or_init(|| {
        let timer: &'static Timer = Box::leak(Box::new(Timer {
            state: Mutex::new(State {
                heap: BinaryHeap::new(),
                sleeping_until: None,
            }),
            wake: Condvar::new(),
        }));
        std::thread::Builder::new()
            .name("terrace-timer".into())
            .spawn(move || timer.run())
            .expect("spawn the timer thread");
        timer
    })
}

impl Timer {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, pending: Pending) {
        let deadline = pending.deadline;
        let mut state = self.lock();
        state.heap.push(pending);
        if state.sleeping_until.is_some_and(|until| deadline < until) {
            // Once is enough: the thread sets its own deadline again when
            // it wakes.
            state.sleeping_until = None;
            drop(state);
            self.wake.notify_one();
        }
    }

    fn run(&self) {
        // SAFETY: PR_SET_TIMERSLACK takes a value and changes only this
        // thread's timer slack.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, SLACK_NS, 0, 0, 0) };
        let mut due = Vec::new();
        let mut state = self.lock();
        loop {
            let now = Instant::now();
            take_due(&mut state.heap, now, &mut due);
            if !due.is_empty() {
                drop(state);
                fire(&mut due);
                state = self.lock();
                continue;
            }
            match state.heap.peek().map(|top| top.deadline) {
                Some(deadline) => {
                    state.sleeping_until = Some(deadline);
                    state = self
                        .wake
                        .wait_timeout(state, deadline - now)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
                None => {
                    state.sleeping_until = Some(now + Duration::from_secs(3600));
                    state = self.wake.wait(state).unwrap_or_else(|e| e.into_inner());
                }
            }
            state.sleeping_until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeps_end_at_their_deadlines_in_any_order_of_creation() {
        let start = Instant::now();
        let delays_ms = [30u64, 5, 20, 1, 10];
        let threads: Vec<_> = delays_ms
            .iter()
            .map(|&ms| {
                std::thread::spawn(move || {
                    let deadline = start + Duration::from_millis(ms);
                    futures::executor::block_on(sleep_until(deadline));
                    Instant::now() >= deadline
                })
            })
            .collect();
        for thread in threads {
            // Never early; how late is a matter of the machine's load.
            assert!(thread.join().unwrap());
        }
    }

    #[test]
    fn a_dropped_sleep_is_not_woken_and_others_still_are() {
        use futures::task::{waker, ArcWake};
        struct Count(std::sync::atomic::AtomicU32);
        impl ArcWake for Count {
            fn wake_by_ref(this: &Arc<Self>) {
                this.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(Default::default()));
        let waker = waker(Arc::clone(&count));
        let mut cx = Context::from_waker(&waker);
        let mut dropped = Box::pin(sleep_until(Instant::now() + Duration::from_millis(5)));
        assert!(dropped.as_mut().poll(&mut cx).is_pending());
        drop(dropped);
        let kept_deadline = Instant::now() + Duration::from_millis(20);
        futures::executor::block_on(sleep_until(kept_deadline));
        assert!(Instant::now() >= kept_deadline);
        assert_eq!(count.0.load(Ordering::SeqCst), 0);
    }

    fn current_thread_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .build()
            .unwrap()
    }

    #[test]
    fn a_threads_own_timer_ends_sleeps_at_their_deadlines() {
        use_thread_timers();
        let runtime = current_thread_runtime();
        let start = Instant::now();
        let late = runtime.block_on(async {
            let sleeps = [30u64, 5, 20, 1, 10, 5].map(|ms| async move {
                let deadline = start + Duration::from_millis(ms);
                sleep_until(deadline).await;
                Instant::now() >= deadline
            });
            futures::future::join_all(sleeps).await
        });
        assert!(late.iter().all(|&on_time| on_time), "{late:?}");
        let timer = THREAD_TIMER.with(|slot| slot.borrow().clone());
        let timer = timer.expect("the sleeps went to this thread's timer");
        assert!(timer.lock().heap.is_empty());
    }

    #[test]
    fn sleeps_outlive_the_runtime_of_their_thread_timer() {
        use futures::task::noop_waker;
        use_thread_timers();
        let deadline = Instant::now() + Duration::from_millis(20);
        let mut sleep = Box::pin(sleep_until(deadline));
        let first = current_thread_runtime();
        first.block_on(async {
            let waker = noop_waker();
            assert!(sleep
                .as_mut()
                .poll(&mut Context::from_waker(&waker))
                .is_pending());
        });
        let timer = THREAD_TIMER.with(|slot| slot.borrow().clone()).unwrap();
        drop(first);
        // Its runtime is gone: the sleep went to the timer thread.
        assert!(timer.lock().closed);
        futures::executor::block_on(sleep);
        assert!(Instant::now() >= deadline);
        // A new runtime on this thread gets a timer of its own again.
        let second = current_thread_runtime();
        let deadline = Instant::now() + Duration::from_millis(2);
        second.block_on(sleep_until(deadline));
        assert!(Instant::now() >= deadline);
        let again = THREAD_TIMER.with(|slot| slot.borrow().clone()).unwrap();
        assert!(!Arc::ptr_eq(&timer, &again));
        assert!(!again.lock().closed);
    }

    #[test]
    fn threads_that_did_not_opt_in_keep_the_timer_thread() {
        let runtime = current_thread_runtime();
        let deadline = Instant::now() + Duration::from_millis(2);
        runtime.block_on(sleep_until(deadline));
        assert!(Instant::now() >= deadline);
        assert!(THREAD_TIMER.with(|slot| slot.borrow().is_none()));
    }
}
