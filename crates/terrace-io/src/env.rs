//! Time and randomness, as parameters.
//!
//! The data-path core never reads a clock or a random source of its own; it
//! asks an [`Env`]. [`SystemEnv`] is the real one; the simulator supplies a
//! virtual clock and a seeded generator, which is what makes a simulated run
//! replay exactly from its seed.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::BoxFuture;

pub trait Env: Send + Sync + 'static {
    /// Monotonic nanoseconds since an arbitrary origin (for rates and delays).
    fn now_ns(&self) -> u64;
    /// Nanoseconds since the Unix epoch (for timestamps kept in metadata).
    fn wall_clock_ns(&self) -> u64;
    /// A future that completes `duration_ns` nanoseconds after this call
    /// (the deadline counts from the call, not from the first poll).
    fn sleep(&self, duration_ns: u64) -> BoxFuture<()>;
    /// A uniformly random 64-bit value (identifiers, tie-breaking).
    fn random_u64(&self) -> u64;
}

/// The real clock, a timer thread ([`crate::timer`]), and the kernel's
/// random source.
#[derive(Debug)]
pub struct SystemEnv {
    origin: Instant,
}

impl SystemEnv {
    pub fn new() -> Self {
        SystemEnv {
            origin: Instant::now(),
        }
    }
}

impl Default for SystemEnv {
    fn default() -> Self {
        Self::new()
    }
}

impl Env for SystemEnv {
    fn now_ns(&self) -> u64 {
        self.origin.elapsed().as_nanos() as u64
    }

    fn wall_clock_ns(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos() as u64)
            .unwrap_or(0)
    }

    fn sleep(&self, duration_ns: u64) -> BoxFuture<()> {
        let deadline = Instant::now() + Duration::from_nanos(duration_ns);
        Box::pin(crate::timer::sleep_until(deadline))
    }

    fn random_u64(&self) -> u64 {
        let mut bytes = [0u8; 8];
        let mut filled = 0;
        while filled < bytes.len() {
            // SAFETY: the pointer and length describe the unfilled tail of `bytes`.
            let result = unsafe {
                libc::getrandom(bytes[filled..].as_mut_ptr().cast(), bytes.len() - filled, 0)
            };
            if result > 0 {
                filled += result as usize;
            } else if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
                // getrandom(2) cannot fail on Linux ≥ 3.17 once the pool is
                // initialised; fall back to the clock rather than panic.
                return self.wall_clock_ns() ^ self.now_ns().rotate_left(32);
            }
        }
        u64::from_le_bytes(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_moves_forward_and_random_varies() {
        let env = SystemEnv::new();
        let first = env.now_ns();
        futures::executor::block_on(env.sleep(1_000_000));
        assert!(env.now_ns() >= first + 1_000_000);
        assert!(env.wall_clock_ns() > 1_600_000_000_000_000_000);
        let values: std::collections::HashSet<u64> = (0..16).map(|_| env.random_u64()).collect();
        assert!(values.len() > 1);
    }
}
