//! SplitMix64: the one small seeded generator of the project, for the
//! simulator's choices, the benchmark's offsets and data, and test data.
//!
//! Seeded, so a run repeats value for value; a few nanoseconds per value, so
//! it never shows in a profile. Not for anything that must be unpredictable
//! (identifiers come from [`crate::Env::random_u64`]).

/// The SplitMix64 increment: 2^64 divided by the golden ratio.
const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// A seeded SplitMix64 generator.
#[derive(Debug, Clone)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GOLDEN_GAMMA);
        mix(self.state)
    }

    /// Uniform in `0..bound` (`bound` > 0), by the remainder: the bias is
    /// below `bound / 2^64`, far under anything measurable here.
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "below(0) has no value to give");
        self.next_u64() % bound
    }

    /// True with probability `numerator / denominator`.
    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }

    /// Fill `buffer` with random bytes (incompressible data).
    pub fn fill(&mut self, buffer: &mut [u8]) {
        let mut chunks = buffer.chunks_exact_mut(8);
        for chunk in &mut chunks {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = chunks.into_remainder();
        if !tail.is_empty() {
            let last = self.next_u64().to_le_bytes();
            tail.copy_from_slice(&last[..tail.len()]);
        }
    }

    /// `length` random bytes.
    pub fn bytes(&mut self, length: usize) -> Vec<u8> {
        let mut out = vec![0; length];
        self.fill(&mut out);
        out
    }
}

/// SplitMix64's output function: a stateless hash of `value` whose every
/// output bit depends on every input bit.
pub fn mix(value: u64) -> u64 {
    let mut z = value;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `index` spread over the whole 64-bit range, for seeds derived from
/// small numbers.
pub fn spread(index: u64) -> u64 {
    index.wrapping_mul(GOLDEN_GAMMA)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_values_are_splitmix64s() {
        // The reference values of SplitMix64 seeded with 1234567.
        let mut random = SplitMix64::new(1_234_567);
        let first: Vec<u64> = (0..3).map(|_| random.next_u64()).collect();
        assert_eq!(
            first,
            [
                6_457_827_717_110_365_317,
                3_203_168_211_198_807_973,
                9_817_491_932_198_370_423
            ]
        );
    }

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut random = SplitMix64::new(7);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            counts[random.below(10) as usize] += 1;
        }
        for count in counts {
            assert!((9_000..11_000).contains(&count), "{counts:?}");
        }
    }

    #[test]
    fn fill_covers_odd_lengths_as_bytes_does() {
        let mut buffer = [0u8; 13];
        SplitMix64::new(1).fill(&mut buffer);
        assert!(buffer[8..].iter().any(|&b| b != 0));
        assert_eq!(SplitMix64::new(1).bytes(13), buffer);
    }
}
