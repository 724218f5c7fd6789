//! A virtual clock: an [`Env`] whose time moves only when its driver says.
//!
//! Sleeps register a deadline when they are made. Nothing fires on its own:
//! whoever drives the futures (a test's executor) calls
//! [`VirtualEnv::advance`] once no task can go on, which moves the clock to
//! the earliest deadline and wakes every sleep that is due. A test so waits
//! for a timeout, a rate limit or an idle period in no real time, and
//! always sees the same order of events. Randomness is a seeded
//! [`SplitMix64`], so identifiers repeat from run to run too.
//!
//! (The simulator has its own clock, inside the world that also completes
//! its disk operations in a seeded order.)

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use crate::random::SplitMix64;
use crate::{BoxFuture, Env};

/// Wall-clock origin of virtual time: 2026-01-01T00:00:00Z.
const WALL_CLOCK_ORIGIN_NS: u64 = 1_767_225_600_000_000_000;

/// Virtual time and seeded randomness.
pub struct VirtualEnv {
    state: Arc<Mutex<State>>,
}

struct State {
    now_ns: u64,
    next_id: u64,
    /// Sleeps not yet due, by (deadline, id), with the waker of their last
    /// poll.
    timers: BTreeMap<(u64, u64), Option<Waker>>,
    random: SplitMix64,
}

impl VirtualEnv {
    pub fn new(seed: u64) -> Arc<VirtualEnv> {
        Arc::new(VirtualEnv {
            state: Arc::new(Mutex::new(State {
                now_ns: 0,
                next_id: 0,
                timers: BTreeMap::new(),
                random: SplitMix64::new(seed),
            })),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }

    /// Move the clock to the earliest deadline of a sleep and wake every
    /// sleep due then. False, with the clock unmoved, when nothing sleeps.
    pub fn advance(&self) -> bool {
        let mut state = self.lock();
        let Some(&(deadline, _)) = state.timers.keys().next() else {
            return false;
        };
        state.now_ns = state.now_ns.max(deadline);
        let later = state.timers.split_off(&(deadline, u64::MAX));
        let due = std::mem::replace(&mut state.timers, later);
        drop(state);
        due.into_values().flatten().for_each(Waker::wake);
        true
    }

    /// How many sleeps are waiting for their deadline.
    pub fn sleeping(&self) -> usize {
        self.lock().timers.len()
    }
}

impl Env for VirtualEnv {
    fn now_ns(&self) -> u64 {
        self.lock().now_ns
    }

    fn wall_clock_ns(&self) -> u64 {
        WALL_CLOCK_ORIGIN_NS + self.now_ns()
    }

    fn sleep(&self, duration_ns: u64) -> BoxFuture<()> {
        let mut state = self.lock();
        let deadline = state.now_ns.saturating_add(duration_ns);
        let id = state.next_id;
        state.next_id += 1;
        if deadline > state.now_ns {
            state.timers.insert((deadline, id), None);
        }
        drop(state);
        Box::pin(Sleep {
            state: self.state.clone(),
            key: (deadline, id),
        })
    }

    fn random_u64(&self) -> u64 {
        self.lock().random.next_u64()
    }
}

fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

/// One sleep: due once the clock reaches its deadline.
struct Sleep {
    state: Arc<Mutex<State>>,
    key: (u64, u64),
}

impl Future for Sleep {
    type Output = ();

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        let mut state = lock(&self.state);
        match state.timers.get_mut(&self.key) {
            Some(waker) => {
                *waker = Some(context.waker().clone());
                Poll::Pending
            }
            None => Poll::Ready(()),
        }
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        lock(&self.state).timers.remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;

    #[test]
    fn a_sleep_ends_when_the_clock_reaches_its_deadline() {
        let env = VirtualEnv::new(1);
        let mut long = env.sleep(2_000);
        let mut short = env.sleep(1_000);
        assert!(
            env.sleep(0).now_or_never().is_some(),
            "a zero sleep is due at once"
        );
        assert!((&mut long).now_or_never().is_none());
        assert!((&mut short).now_or_never().is_none());
        assert!(env.advance());
        assert_eq!(env.now_ns(), 1_000);
        assert!((&mut short).now_or_never().is_some());
        assert!((&mut long).now_or_never().is_none());
        assert!(env.advance());
        assert_eq!(env.now_ns(), 2_000);
        assert!(long.now_or_never().is_some());
        assert!(!env.advance(), "nothing left to wake");
        assert_eq!(env.now_ns(), 2_000);
    }

    #[test]
    fn a_dropped_sleep_holds_the_clock_no_more() {
        let env = VirtualEnv::new(1);
        drop(env.sleep(5_000));
        assert_eq!(env.sleeping(), 0);
        assert!(!env.advance());
        assert_eq!(env.now_ns(), 0);
    }

    #[test]
    fn randomness_repeats_from_the_seed() {
        let (a, b) = (VirtualEnv::new(9), VirtualEnv::new(9));
        assert_eq!(a.random_u64(), b.random_u64());
        assert_ne!(a.random_u64(), VirtualEnv::new(10).random_u64());
    }
}
