//! The timer behind [`SystemEnv::sleep`](crate::SystemEnv): one thread,
//! woken only when it has a deadline to meet.
//!
//! Drive models sleep once per request, so a sleep must cost little. A
//! new sleep goes into a heap under a lock and wakes the timer thread only
//! if it is due before the deadline the thread already sleeps towards (a
//! device's requests mostly finish in the order they were queued, so that
//! is rare). The thread wakes at the earliest deadline, wakes every sleeper
//! that is due, and sleeps again. Its timer slack is 1 µs instead of the
//! default 50 µs, so a modelled drive's service times are what its
//! parameters say and not up to 50 µs longer.
//!
//! A sleep dropped before its deadline takes its waker back, so the timer
//! never wakes a task for a sleep it gave up; its heap entry is discarded
//! when due.

use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;

/// Timer slack of the timer thread: how late the kernel may wake it.
const SLACK_NS: libc::c_ulong = 1_000;

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

/// What a sleep and the timer thread share.
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
                timer().insert(self.deadline, Arc::clone(&entry));
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

/// A sleep in the heap, earliest deadline first. Sleeps with one deadline
/// need no order among them: the thread wakes every sleep that is due at
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

struct State {
    heap: BinaryHeap<Pending>,
    /// The deadline the thread sleeps towards (`None`: it is awake, and
    /// looks at the heap before it sleeps again).
    sleeping_until: Option<Instant>,
}

struct Timer {
    state: Mutex<State>,
    wake: Condvar,
}

fn timer() -> &'static Timer {
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

    fn insert(&self, deadline: Instant, entry: Arc<Entry>) {
        let mut state = self.lock();
        state.heap.push(Pending { deadline, entry });
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
            while state.heap.peek().is_some_and(|top| top.deadline <= now) {
                due.extend(state.heap.pop().map(|pending| pending.entry));
            }
            if !due.is_empty() {
                drop(state);
                for entry in due.drain(..) {
                    entry.fired.store(true, Ordering::Release);
                    entry.waker.wake();
                }
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
}
