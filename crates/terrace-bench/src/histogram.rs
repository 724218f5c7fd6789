//! A log-bucketed latency histogram (the HDR histogram idea, fixed
//! precision): values below 64 ns have a bucket each; above, every power of
//! two is cut into 64 buckets, so a bucket is at most 1/64 (1.6 %) of its
//! values wide. Recording is an index computation and an increment; the
//! whole `u64` range takes 3776 buckets (30 KiB).
//!
//! Quantiles are reported as the middle of their bucket (clamped to the
//! largest value seen), so they are within 0.8 % of the true value; the
//! mean is exact (a running sum).

/// Sub-buckets per power of two, as a power of two: 2^6 = 64 buckets bound
/// the error to 1.6 %, well under run-to-run noise.
const SUB_BITS: u32 = 6;
const SUB: u64 = 1 << SUB_BITS;
/// Buckets for every `u64`: the linear first 64, then 64 per exponent.
const BUCKETS: usize = ((64 - SUB_BITS as usize) + 1) * SUB as usize;

#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Vec<u64>,
    count: u64,
    sum: u128,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: vec![0; BUCKETS],
            count: 0,
            sum: 0,
            max: 0,
        }
    }
}

fn index(value: u64) -> usize {
    if value < SUB {
        return value as usize;
    }
    let exponent = 63 - value.leading_zeros();
    let shift = exponent - SUB_BITS;
    let mantissa = (value >> shift) - SUB;
    ((shift as u64 + 1) * SUB + mantissa) as usize
}

/// The smallest value of bucket `index`, and its width.
fn bucket(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < SUB {
        return (index, 1);
    }
    let shift = index / SUB - 1;
    ((index % SUB + SUB) << shift, 1 << shift)
}

impl Histogram {
    pub fn record(&mut self, value: u64) {
        self.counts[index(value)] += 1;
        self.count += 1;
        self.sum += u128::from(value);
        self.max = self.max.max(value);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn max(&self) -> u64 {
        self.max
    }

    /// The exact mean, 0 when empty.
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sum as f64 / self.count as f64
    }

    /// The value below which `quantile` (0 to 1) of the values lie, 0 when
    /// empty.
    pub fn quantile(&self, quantile: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((quantile.clamp(0.0, 1.0) * self.count as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (index, &count) in self.counts.iter().enumerate() {
            seen += count;
            if seen >= rank {
                let (low, width) = bucket(index);
                return (low + width / 2).min(self.max);
            }
        }
        self.max
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (mine, theirs) in self.counts.iter_mut().zip(&other.counts) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.max = self.max.max(other.max);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_values_with_bounded_error() {
        for value in [
            0u64,
            1,
            63,
            64,
            65,
            127,
            128,
            1000,
            12_345,
            1 << 40,
            u64::MAX,
        ] {
            let (low, width) = bucket(index(value));
            assert!(low <= value && value - low < width, "{value}");
            assert!(width == 1 || width as f64 / low as f64 <= 1.0 / 64.0 + 1e-12);
        }
        assert_eq!(index(u64::MAX), BUCKETS - 1);
    }

    #[test]
    fn quantiles_and_mean() {
        let mut histogram = Histogram::default();
        for value in 1..=1000u64 {
            histogram.record(value * 1000);
        }
        assert_eq!(histogram.count(), 1000);
        assert!((histogram.mean() - 500_500.0).abs() < 1e-6);
        let p99 = histogram.quantile(0.99) as f64;
        assert!((p99 - 990_000.0).abs() / 990_000.0 < 0.01, "{p99}");
        let p50 = histogram.quantile(0.5) as f64;
        assert!((p50 - 500_000.0).abs() / 500_000.0 < 0.01, "{p50}");
        assert_eq!(histogram.quantile(1.0), 1_000_000);
        let mut merged = Histogram::default();
        merged.merge(&histogram);
        assert_eq!(merged.quantile(0.99), histogram.quantile(0.99));
        assert_eq!(Histogram::default().quantile(0.99), 0);
    }
}
