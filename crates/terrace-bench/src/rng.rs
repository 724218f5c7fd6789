//! A small seeded generator (SplitMix64) for offsets, the read/write choice
//! and write data. Seeded so that a run can be repeated request for request;
//! fast (a few nanoseconds per value) so that it never shows in a profile.

#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..bound` (`bound` > 0), by the multiply-high method: the
    /// bias is below `bound / 2^64`, far under anything measurable here.
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// Fill `buffer` with random bytes (incompressible write data).
    pub fn fill(&mut self, buffer: &mut [u8]) {
        let mut chunks = buffer.chunks_exact_mut(8);
        for chunk in &mut chunks {
            chunk.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        let tail = chunks.into_remainder();
        let last = self.next_u64().to_le_bytes();
        tail.copy_from_slice(&last[..tail.len()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_is_in_range_and_roughly_uniform() {
        let mut rng = Rng::new(7);
        let mut counts = [0u32; 10];
        for _ in 0..100_000 {
            let value = rng.below(10);
            counts[value as usize] += 1;
        }
        for count in counts {
            assert!((9_000..11_000).contains(&count), "{counts:?}");
        }
        assert_eq!(Rng::new(3).next_u64(), Rng::new(3).next_u64());
    }

    #[test]
    fn fill_covers_odd_lengths() {
        let mut buffer = [0u8; 13];
        Rng::new(1).fill(&mut buffer);
        assert!(buffer[8..].iter().any(|&b| b != 0));
    }
}
