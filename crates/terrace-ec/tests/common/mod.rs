//! Helpers shared by the integration tests: a small deterministic random
//! generator and the list of implementations to hold against the oracle.

#![allow(dead_code)] // each test file uses a different subset

use terrace_ec::EcError;

/// xorshift64*: deterministic, seedable, good enough to fill test buffers.
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Self {
        // xorshift has a fixed point at zero; any other start is fine.
        Self(seed | 1)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn fill(&mut self, buffer: &mut [u8]) {
        for chunk in buffer.chunks_mut(8) {
            let word = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }

    pub fn bytes(&mut self, length: usize) -> Vec<u8> {
        let mut buffer = vec![0; length];
        self.fill(&mut buffer);
        buffer
    }

    pub fn columns(&mut self, count: usize, length: usize) -> Vec<Vec<u8>> {
        (0..count).map(|_| self.bytes(length)).collect()
    }
}

pub type EncodeP = fn(&[&[u8]], &mut [u8]);
pub type EncodePq = fn(&[&[u8]], &mut [u8], &mut [u8]);
pub type XorInto = fn(&mut [u8], &[u8]);
pub type MulXorInto = fn(&mut [u8], &[u8], u8);
pub type Reconstruct = fn(&mut [&mut [u8]], usize, &[usize]) -> Result<(), EcError>;

/// One implementation's function set.
pub struct Implementation {
    pub name: &'static str,
    pub encode_p: EncodeP,
    pub encode_pq: EncodePq,
    pub xor_into: XorInto,
    pub mul_xor_into: MulXorInto,
    pub reconstruct: Reconstruct,
}

pub fn scalar() -> Implementation {
    use terrace_ec::scalar;
    Implementation {
        name: "scalar",
        encode_p: scalar::encode_p,
        encode_pq: scalar::encode_pq,
        xor_into: scalar::xor_into,
        mul_xor_into: scalar::mul_xor_into,
        reconstruct: scalar::reconstruct,
    }
}

/// The dispatching public functions, the portable implementation, and AVX2
/// when this CPU has it.
pub fn fast_implementations() -> Vec<Implementation> {
    let mut list = vec![
        Implementation {
            name: "dispatch",
            encode_p: terrace_ec::encode_p,
            encode_pq: terrace_ec::encode_pq,
            xor_into: terrace_ec::xor_into,
            mul_xor_into: terrace_ec::mul_xor_into,
            reconstruct: terrace_ec::reconstruct,
        },
        Implementation {
            name: "portable",
            encode_p: terrace_ec::portable::encode_p,
            encode_pq: terrace_ec::portable::encode_pq,
            xor_into: terrace_ec::portable::xor_into,
            mul_xor_into: terrace_ec::portable::mul_xor_into,
            reconstruct: terrace_ec::portable::reconstruct,
        },
    ];
    #[cfg(target_arch = "x86_64")]
    if terrace_ec::avx2::is_available() {
        list.push(Implementation {
            name: "avx2",
            encode_p: terrace_ec::avx2::encode_p,
            encode_pq: terrace_ec::avx2::encode_pq,
            xor_into: terrace_ec::avx2::xor_into,
            mul_xor_into: terrace_ec::avx2::mul_xor_into,
            reconstruct: terrace_ec::avx2::reconstruct,
        });
    } else {
        eprintln!("AVX2 not available on this CPU: its implementation is not tested");
    }
    list
}

/// Every implementation with a reconstruct, the oracle included.
pub fn all_implementations() -> Vec<Implementation> {
    let mut list = vec![scalar()];
    list.extend(fast_implementations());
    list
}

pub fn as_slices(columns: &[Vec<u8>]) -> Vec<&[u8]> {
    columns.iter().map(Vec::as_slice).collect()
}

/// A complete stripe encoded by the oracle: data columns, P, and Q if
/// `parity == 2`.
pub fn encoded_stripe(
    random: &mut Random,
    data_columns: usize,
    parity: usize,
    length: usize,
) -> Vec<Vec<u8>> {
    let mut stripe = random.columns(data_columns, length);
    let mut p = vec![0; length];
    let mut q = vec![0; length];
    terrace_ec::scalar::encode_pq(&as_slices(&stripe), &mut p, &mut q);
    stripe.push(p);
    if parity == 2 {
        stripe.push(q);
    }
    stripe
}

/// Every set of at most `most` distinct indices below `count`, each sorted,
/// the empty set included.
pub fn erasure_patterns(count: usize, most: usize) -> Vec<Vec<usize>> {
    let mut patterns = vec![vec![]];
    for first in 0..count {
        patterns.push(vec![first]);
        if most >= 2 {
            for second in first + 1..count {
                patterns.push(vec![first, second]);
            }
        }
    }
    patterns
}
