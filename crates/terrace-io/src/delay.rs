//! Latency injection: every operation waits before it reaches the device.
//!
//! A [`DelayDevice`] gives each operation a fixed latency for its kind plus an
//! optional random jitter, then runs it on the inner device. Time and
//! randomness come only from the [`Env`], never from a clock of its own, so
//! under the simulator's virtual clock a delayed run replays exactly from its
//! seed, and with [`crate::SystemEnv`] it behaves like a slow real drive.
//!
//! The wait starts when the operation is issued (the call), not when its
//! future is first polled, as a drive's latency starts at submission.
//! Operations in flight together wait concurrently, so a delay models
//! latency, not a throughput limit.

use std::sync::Arc;

use crate::{BlockDevice, BoxFuture, Bytes, BytesMut, Env, IoResult};

/// Latency per kind of operation, in nanoseconds of the [`Env`]'s clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DelayPolicy {
    pub read_ns: u64,
    /// Also used for write-zeroes.
    pub write_ns: u64,
    pub flush_ns: u64,
    /// Each operation waits an extra uniform `0..=jitter_ns`, drawn from
    /// [`Env::random_u64`]. Zero draws nothing.
    pub jitter_ns: u64,
}

pub struct DelayDevice {
    inner: Arc<dyn BlockDevice>,
    env: Arc<dyn Env>,
    policy: DelayPolicy,
}

impl DelayDevice {
    pub fn new(inner: Arc<dyn BlockDevice>, env: Arc<dyn Env>, policy: DelayPolicy) -> Self {
        DelayDevice { inner, env, policy }
    }

    pub fn policy(&self) -> DelayPolicy {
        self.policy
    }

    pub fn inner(&self) -> &Arc<dyn BlockDevice> {
        &self.inner
    }

    /// The wait for one operation whose fixed latency is `base_ns`, or `None`
    /// when there is nothing to wait for.
    fn wait(&self, base_ns: u64) -> Option<BoxFuture<()>> {
        let jitter = match self.policy.jitter_ns {
            0 => 0,
            bound => self.env.random_u64() % bound.saturating_add(1),
        };
        let total = base_ns.saturating_add(jitter);
        (total > 0).then(|| self.env.sleep(total))
    }
}

/// Wait for `wait` (if any), then run the operation `run` builds.
fn delayed<T: Send + 'static>(
    wait: Option<BoxFuture<()>>,
    run: impl FnOnce() -> BoxFuture<T> + Send + 'static,
) -> BoxFuture<T> {
    match wait {
        None => run(),
        Some(wait) => Box::pin(async move {
            wait.await;
            run().await
        }),
    }
}

impl BlockDevice for DelayDevice {
    crate::forward_device_answers!(inner: name, size_bytes, alignment, cheap_fua, allocates_on_first_write, rotational);

    fn read(&self, offset: u64, buf: BytesMut) -> BoxFuture<(BytesMut, IoResult<()>)> {
        let inner = Arc::clone(&self.inner);
        delayed(self.wait(self.policy.read_ns), move || {
            inner.read(offset, buf)
        })
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool) -> BoxFuture<IoResult<()>> {
        let inner = Arc::clone(&self.inner);
        delayed(self.wait(self.policy.write_ns), move || {
            inner.write(offset, data, fua)
        })
    }

    fn write_zeroes(&self, offset: u64, length: u64, fua: bool) -> BoxFuture<IoResult<()>> {
        let inner = Arc::clone(&self.inner);
        delayed(self.wait(self.policy.write_ns), move || {
            inner.write_zeroes(offset, length, fua)
        })
    }

    fn flush(&self) -> BoxFuture<IoResult<()>> {
        let inner = Arc::clone(&self.inner);
        delayed(self.wait(self.policy.flush_ns), move || inner.flush())
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::Mutex;
    use std::task::{Context, Poll, Waker};

    use futures::task::noop_waker_ref;

    use super::*;
    use crate::memory::MemoryDevice;

    /// A clock that moves only when the test says so.
    struct ManualEnv {
        state: Arc<Mutex<Clock>>,
        random: u64,
    }

    struct Clock {
        now: u64,
        sleepers: Vec<Waker>,
        sleeps_requested: Vec<u64>,
    }

    impl ManualEnv {
        fn new(random: u64) -> Arc<Self> {
            Arc::new(ManualEnv {
                state: Arc::new(Mutex::new(Clock {
                    now: 0,
                    sleepers: Vec::new(),
                    sleeps_requested: Vec::new(),
                })),
                random,
            })
        }

        fn advance(&self, ns: u64) {
            let sleepers = {
                let mut clock = self.state.lock().unwrap();
                clock.now += ns;
                std::mem::take(&mut clock.sleepers)
            };
            sleepers.into_iter().for_each(Waker::wake);
        }

        fn sleeps_requested(&self) -> Vec<u64> {
            self.state.lock().unwrap().sleeps_requested.clone()
        }
    }

    struct Sleep {
        clock: Arc<Mutex<Clock>>,
        deadline: u64,
    }

    impl Future for Sleep {
        type Output = ();

        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
            let mut clock = self.clock.lock().unwrap();
            if clock.now >= self.deadline {
                return Poll::Ready(());
            }
            clock.sleepers.push(cx.waker().clone());
            Poll::Pending
        }
    }

    impl Env for ManualEnv {
        fn now_ns(&self) -> u64 {
            self.state.lock().unwrap().now
        }

        fn wall_clock_ns(&self) -> u64 {
            self.now_ns()
        }

        fn sleep(&self, duration_ns: u64) -> BoxFuture<()> {
            let mut clock = self.state.lock().unwrap();
            clock.sleeps_requested.push(duration_ns);
            Box::pin(Sleep {
                clock: Arc::clone(&self.state),
                deadline: clock.now + duration_ns,
            })
        }

        fn random_u64(&self) -> u64 {
            self.random
        }
    }

    fn poll<T>(future: &mut BoxFuture<T>) -> Poll<T> {
        future
            .as_mut()
            .poll(&mut Context::from_waker(noop_waker_ref()))
    }

    fn policy() -> DelayPolicy {
        DelayPolicy {
            read_ns: 100,
            write_ns: 1_000,
            flush_ns: 5_000,
            jitter_ns: 0,
        }
    }

    #[test]
    fn a_write_reaches_the_device_only_after_its_latency() {
        let env = ManualEnv::new(0);
        let memory = Arc::new(MemoryDevice::new("memory:0", 8192));
        let device = DelayDevice::new(memory.clone(), env.clone(), policy());
        let mut write = device.write(0, Bytes::from(vec![7u8; 4096]), false);
        assert!(poll(&mut write).is_pending());
        env.advance(999);
        assert!(poll(&mut write).is_pending());
        assert_eq!(memory.read_sync(0, 1), vec![0], "not yet applied");
        env.advance(1);
        assert!(matches!(poll(&mut write), Poll::Ready(Ok(()))));
        assert_eq!(memory.read_sync(0, 4096), vec![7u8; 4096]);
    }

    #[test]
    fn each_kind_waits_its_own_latency() {
        let env = ManualEnv::new(0);
        let memory = Arc::new(MemoryDevice::new("memory:0", 8192));
        let device = DelayDevice::new(memory, env.clone(), policy());
        let mut read = device.read(0, BytesMut::zeroed(16));
        let mut flush = device.flush();
        let mut zeroes = device.write_zeroes(0, 16, false);
        env.advance(100);
        assert!(matches!(poll(&mut read), Poll::Ready((_, Ok(())))));
        assert!(poll(&mut flush).is_pending());
        assert!(poll(&mut zeroes).is_pending());
        env.advance(900);
        assert!(poll(&mut zeroes).is_ready());
        assert!(poll(&mut flush).is_pending());
        env.advance(4_000);
        assert!(poll(&mut flush).is_ready());
        assert_eq!(env.sleeps_requested(), vec![100, 5_000, 1_000]);
    }

    #[test]
    fn jitter_comes_from_the_env_random_source() {
        // 1234 % (500 + 1) = 232 extra nanoseconds.
        let env = ManualEnv::new(1234);
        let memory = Arc::new(MemoryDevice::new("memory:0", 8192));
        let jittery = DelayPolicy {
            jitter_ns: 500,
            ..policy()
        };
        let device = DelayDevice::new(memory, env.clone(), jittery);
        let mut write = device.write(0, Bytes::from_static(b"x"), false);
        env.advance(1_231);
        assert!(poll(&mut write).is_pending());
        env.advance(1);
        assert!(poll(&mut write).is_ready());
        assert_eq!(env.sleeps_requested(), vec![1_232]);
    }

    #[test]
    fn zero_latency_does_not_sleep_and_errors_pass_through() {
        let env = ManualEnv::new(0);
        let memory = Arc::new(MemoryDevice::new("memory:0", 4096));
        let device = DelayDevice::new(memory, env.clone(), DelayPolicy::default());
        let mut write = device.write(4096, Bytes::from_static(b"x"), false);
        assert!(matches!(
            poll(&mut write),
            Poll::Ready(Err(crate::IoError::OutOfRange { .. }))
        ));
        assert!(env.sleeps_requested().is_empty());
    }

    #[test]
    fn works_with_the_system_clock() {
        let memory = Arc::new(MemoryDevice::new("memory:0", 4096));
        let env: Arc<dyn Env> = Arc::new(crate::SystemEnv::new());
        let device = DelayDevice::new(
            memory.clone(),
            env,
            DelayPolicy {
                read_ns: 1_000,
                write_ns: 1_000,
                flush_ns: 1_000,
                jitter_ns: 1_000,
            },
        );
        futures::executor::block_on(device.write(0, Bytes::from_static(b"abc"), true)).unwrap();
        futures::executor::block_on(device.flush()).unwrap();
        assert_eq!(memory.read_sync(0, 3), b"abc".to_vec());
    }
}
