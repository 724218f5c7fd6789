//! CPU time of the whole machine, from `/proc/stat`.
//!
//! The benchmark reports CPU µs per I/O as the busy time of **all** CPUs
//! over the measured interval, divided by the I/Os completed in it. It is
//! system-wide on purpose: the cost of an I/O is spread over the load
//! generator, the server (another process: the terrace daemon, nbdkit),
//! the kernel's network and block layers, and interrupt and softirq time
//! that is charged to whichever process happens to run. Per-process
//! accounting (`getrusage`) would miss most of that. The price is that
//! anything else running on the machine is counted too: benchmark on an
//! otherwise idle machine.
//!
//! Busy time is user + nice + system + irq + softirq + steal (guest time is
//! already inside user); idle and iowait are not busy. `/proc/stat` counts
//! in clock ticks (`_SC_CLK_TCK`, 100 per second on Linux), so a measured
//! interval of a few seconds resolves well under 1 %.

/// Busy CPU time summed over all CPUs at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CpuSample {
    busy_seconds: f64,
}

/// Read the `cpu` line of `/proc/stat`; `None` where it is not available
/// (not Linux, or a restricted container).
pub fn sample() -> Option<CpuSample> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse(&stat, ticks_per_second()?)
}

fn ticks_per_second() -> Option<f64> {
    // SAFETY: sysconf has no preconditions and only reads a constant.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks > 0).then_some(ticks as f64)
}

fn parse(stat: &str, ticks_per_second: f64) -> Option<CpuSample> {
    let line = stat.lines().find(|line| line.starts_with("cpu "))?;
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|field| field.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    let field = |index: usize| fields.get(index).copied().unwrap_or(0);
    let busy = field(0) + field(1) + field(2) + field(5) + field(6) + field(7);
    Some(CpuSample {
        busy_seconds: busy as f64 / ticks_per_second,
    })
}

impl CpuSample {
    /// Busy CPU seconds between `earlier` and `self`.
    pub fn busy_since(&self, earlier: &CpuSample) -> f64 {
        (self.busy_seconds - earlier.busy_seconds).max(0.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_busy_time() {
        let stat = "cpu  100 5 50 1000 20 3 2 1 7 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n";
        let sample = parse(stat, 100.0).expect("parses");
        assert!((sample.busy_seconds - 1.61).abs() < 1e-9);
        let later = CpuSample { busy_seconds: 2.0 };
        assert!((later.busy_since(&sample) - 0.39).abs() < 1e-9);
        assert!(parse("intr 1 2 3\n", 100.0).is_none());
        assert!(parse("cpu  1 x 3\n", 100.0).is_none());
    }

    #[test]
    fn samples_this_machine() {
        if std::path::Path::new("/proc/stat").exists() {
            assert!(sample().is_some());
        }
    }
}
