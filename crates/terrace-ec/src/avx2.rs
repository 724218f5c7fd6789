//! The AVX2 implementation: 32 bytes per register, several registers in flight.
//!
//! * XOR is `vpxor`.
//! * Multiplication by 2 (the Horner step of Q) works on 32 bytes at once:
//!   a signed compare against zero marks the bytes whose top bit is set
//!   (those are negative as `i8`), a byte-wise add of the value to itself
//!   shifts every byte left by one without crossing into its neighbour, and
//!   the marked bytes get the reduction 0x1d XOR-ed in.
//! * Multiplication by an arbitrary coefficient `c` splits every byte into its
//!   two nibbles and looks each up in a 16-entry table of products with
//!   `vpshufb`, which does 32 such lookups in one instruction:
//!   `c·b = c·(b & 0x0f) ⊕ c·(b & 0xf0)`.
//!
//! Whatever is left after the last whole register (under 32 bytes) goes to the
//! portable kernels.
//!
//! The public functions here are safe: each checks its arguments and that the
//! CPU has AVX2, and panics otherwise. The internal `unsafe fn`s are unsafe
//! for two reasons only, stated in their `# Safety` sections: they are compiled
//! with AVX2 enabled, and they read and write whole registers at offsets the
//! caller has checked against the buffer lengths.

use std::arch::x86_64::{
    __m256i, _mm256_add_epi8, _mm256_and_si256, _mm256_broadcastsi128_si256, _mm256_cmpgt_epi8,
    _mm256_loadu_si256, _mm256_set1_epi8, _mm256_setzero_si256, _mm256_shuffle_epi8,
    _mm256_srli_epi64, _mm256_storeu_si256, _mm256_xor_si256, _mm_loadu_si128,
};

use crate::check;
use crate::field::{NIBBLE_HIGH, NIBBLE_LOW, REDUCTION};
use crate::kernel::{ColumnsWithHoles, DataColumns, Kernels, LostPair, ParityPair, Suffix};
use crate::portable;
use crate::EcError;

/// Bytes in one AVX2 register.
const LANE: usize = 32;

/// Registers processed together. Four independent Horner chains hide the
/// latency of each multiply-by-2 step, and with P, Q and temporaries that is
/// still well inside the sixteen registers AVX2 has.
const LANES_PER_BLOCK: usize = 4;

/// Bytes per block.
const BLOCK: usize = LANE * LANES_PER_BLOCK;

/// Keeps the low nibble of every byte.
const NIBBLE_MASK: i8 = 0x0f;

/// Bits in a nibble: the shift that brings the high nibble down.
const NIBBLE_BITS: i32 = 4;

/// The kernels of this implementation, for the dispatcher and for `solve`.
pub(crate) static KERNELS: Kernels = Kernels {
    name: "avx2",
    encode_p: xor_sources,
    encode_q,
    encode_pq,
    accumulate_q,
    rebuild_two,
    xor_into,
    mul_xor_into,
};

/// Whether this CPU can run this implementation.
pub fn is_available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

/// Panics unless AVX2 is there; every safe entry point calls this before
/// entering AVX2 code. The detection result is cached by the standard
/// library, so this is a load and a branch.
fn require_avx2() {
    assert!(
        is_available(),
        "the avx2 parity implementation was called on a CPU without AVX2"
    );
}

/// `p` = XOR of the data columns.
pub fn encode_p(data: &[&[u8]], p: &mut [u8]) {
    check::data_columns(data, p.len());
    require_avx2();
    // SAFETY: AVX2 is present (checked above) and every column is `p.len()`
    // bytes (checked above).
    unsafe { xor_columns(data, p) }
}

/// `p` = XOR of the data columns, `q = Σ g^i · data[i]`, in one pass.
pub fn encode_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    check::data_columns(data, q.len());
    check::same_length(p, q);
    require_avx2();
    // SAFETY: AVX2 is present and all buffers are `q.len()` bytes (checked above).
    unsafe { syndromes::<_, false>(data, Some(p), q) }
}

/// `destination ^= source`.
pub fn xor_into(destination: &mut [u8], source: &[u8]) {
    check::same_length(destination, source);
    require_avx2();
    // SAFETY: AVX2 is present and the lengths are equal (checked above).
    unsafe { xor_into_avx2(destination, source) }
}

/// `destination ^= coefficient · source`.
pub fn mul_xor_into(destination: &mut [u8], source: &[u8], coefficient: u8) {
    check::same_length(destination, source);
    require_avx2();
    match coefficient {
        0 => {}
        // SAFETY: AVX2 is present and the lengths are equal (checked above).
        1 => unsafe { xor_into_avx2(destination, source) },
        // SAFETY: as above.
        _ => unsafe { mul_xor_into_avx2(destination, source, coefficient) },
    }
}

/// Rebuilds the erased columns of a stripe; see [`crate::reconstruct`].
pub fn reconstruct(
    columns: &mut [&mut [u8]],
    parity: usize,
    erased: &[usize],
) -> Result<(), EcError> {
    require_avx2();
    crate::solve::reconstruct(&KERNELS, columns, parity, erased)
}

fn xor_sources(sources: &[&[u8]], out: &mut [u8]) {
    check::sources(sources, out.len());
    require_avx2();
    // SAFETY: AVX2 is present and every source is `out.len()` bytes (checked above).
    unsafe { xor_columns(sources, out) }
}

fn encode_q(data: &[&[u8]], q: &mut [u8]) {
    check::data_columns(data, q.len());
    require_avx2();
    // SAFETY: AVX2 is present and every column is `q.len()` bytes (checked above).
    unsafe { syndromes::<_, false>(data, None, q) }
}

fn accumulate_q(data: &[Option<&[u8]>], q: &mut [u8]) {
    check::present_columns(data, q.len());
    require_avx2();
    // SAFETY: AVX2 is present and every present column is `q.len()` bytes.
    unsafe { syndromes::<_, true>(data, None, q) }
}

fn rebuild_two(data: &ColumnsWithHoles, parity: ParityPair, lost: LostPair, coefficients: [u8; 2]) {
    let [p, q] = parity;
    let [x, y] = lost;
    check::present_columns(data, p.len());
    check::same_length(q, p);
    check::same_length(x, p);
    check::same_length(y, p);
    require_avx2();
    // SAFETY: AVX2 is present and every buffer is `p.len()` bytes (checked above).
    unsafe { rebuild_two_avx2(data, [p, q], [x, y], coefficients) }
}

/// Loads 32 bytes from `bytes[offset..]`.
///
/// # Safety
/// The CPU has AVX2 and `offset + LANE <= bytes.len()`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn load(bytes: &[u8], offset: usize) -> __m256i {
    debug_assert!(offset + LANE <= bytes.len());
    // SAFETY: the caller guarantees the 32 bytes at `offset` lie inside
    // `bytes`; the unaligned load has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().add(offset).cast()) }
}

/// Stores 32 bytes to `bytes[offset..]`.
///
/// # Safety
/// The CPU has AVX2 and `offset + LANE <= bytes.len()`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn store(bytes: &mut [u8], offset: usize, value: __m256i) {
    debug_assert!(offset + LANE <= bytes.len());
    // SAFETY: the caller guarantees the 32 bytes at `offset` lie inside
    // `bytes`, which is borrowed mutably; the unaligned store has no
    // alignment requirement.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().add(offset).cast(), value) }
}

/// Multiplies each of the 32 bytes by 2 in GF(2^8).
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn mul2(value: __m256i) -> __m256i {
    // A byte with its top bit set is negative as i8, so `0 > value` yields
    // 0xff in exactly the bytes that overflow when shifted.
    let overflowed = _mm256_cmpgt_epi8(_mm256_setzero_si256(), value);
    // AVX2 has no byte shift; adding a byte to itself is the same as shifting
    // it left by one, and the add never carries between bytes.
    let shifted = _mm256_add_epi8(value, value);
    let reduction = _mm256_and_si256(overflowed, _mm256_set1_epi8(REDUCTION as i8));
    _mm256_xor_si256(shifted, reduction)
}

/// The two 16-entry product tables of one coefficient, each copied into both
/// 128-bit halves because `vpshufb` looks up within each half separately.
#[derive(Clone, Copy)]
struct Multiplier {
    low: __m256i,
    high: __m256i,
}

/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn multiplier(coefficient: u8) -> Multiplier {
    let low = &NIBBLE_LOW[usize::from(coefficient)];
    let high = &NIBBLE_HIGH[usize::from(coefficient)];
    // SAFETY: each table row is exactly 16 bytes, the size of the load; the
    // unaligned load has no alignment requirement.
    let (low, high) = unsafe {
        (
            _mm_loadu_si128(low.as_ptr().cast()),
            _mm_loadu_si128(high.as_ptr().cast()),
        )
    };
    Multiplier {
        low: _mm256_broadcastsi128_si256(low),
        high: _mm256_broadcastsi128_si256(high),
    }
}

/// `coefficient · value` for 32 bytes, with the coefficient's tables.
///
/// # Safety
/// The CPU has AVX2.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn multiply(multiplier: Multiplier, value: __m256i) -> __m256i {
    let mask = _mm256_set1_epi8(NIBBLE_MASK);
    let low_nibbles = _mm256_and_si256(value, mask);
    // There is no byte shift: shift 64-bit lanes and mask away the bits that
    // moved in from the neighbouring byte.
    let high_nibbles = _mm256_and_si256(_mm256_srli_epi64::<NIBBLE_BITS>(value), mask);
    _mm256_xor_si256(
        _mm256_shuffle_epi8(multiplier.low, low_nibbles),
        _mm256_shuffle_epi8(multiplier.high, high_nibbles),
    )
}

/// `out` = XOR of the sources.
///
/// # Safety
/// The CPU has AVX2; there is at least one source and every source is
/// `out.len()` bytes.
#[target_feature(enable = "avx2")]
unsafe fn xor_columns(sources: &[&[u8]], out: &mut [u8]) {
    let length = out.len();
    let mut offset = 0;
    while offset + BLOCK <= length {
        // SAFETY: a whole block fits at `offset` in every buffer.
        unsafe { xor_lanes::<LANES_PER_BLOCK>(sources, out, offset) };
        offset += BLOCK;
    }
    while offset + LANE <= length {
        // SAFETY: a whole register fits at `offset` in every buffer.
        unsafe { xor_lanes::<1>(sources, out, offset) };
        offset += LANE;
    }
    let tail = Suffix {
        columns: sources,
        start: offset,
    };
    portable::xor_columns(&tail, &mut out[offset..]);
}

/// [`xor_columns`] for `LANES` registers at `offset`.
///
/// # Safety
/// The CPU has AVX2; `offset + LANES * LANE` is within `out` and every source,
/// and there is at least one source.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn xor_lanes<const LANES: usize>(sources: &[&[u8]], out: &mut [u8], offset: usize) {
    let mut sum = [_mm256_setzero_si256(); LANES];
    for source in sources {
        for (lane, value) in sum.iter_mut().enumerate() {
            // SAFETY: in bounds by this function's contract.
            *value = _mm256_xor_si256(*value, unsafe { load(source, offset + lane * LANE) });
        }
    }
    for (lane, value) in sum.iter().enumerate() {
        // SAFETY: in bounds by this function's contract.
        unsafe { store(out, offset + lane * LANE, *value) };
    }
}

/// The syndromes of the present data columns: `q = Σ g^i · data[i]` and, if
/// `p` is given, `p = Σ data[i]`; with `ACCUMULATE` they are XOR-ed into the
/// outputs. Q uses Horner's rule from the highest column down, as in
/// [`portable::syndromes`], with [`mul2`] as the step.
///
/// # Safety
/// The CPU has AVX2; `data` has at least one column, and every present column
/// and `p` are `q.len()` bytes.
#[target_feature(enable = "avx2")]
unsafe fn syndromes<C: DataColumns + ?Sized, const ACCUMULATE: bool>(
    data: &C,
    mut p: Option<&mut [u8]>,
    q: &mut [u8],
) {
    let length = q.len();
    let mut offset = 0;
    while offset + BLOCK <= length {
        // SAFETY: a whole block fits at `offset` in every buffer.
        unsafe {
            syndrome_lanes::<C, ACCUMULATE, LANES_PER_BLOCK>(data, p.as_deref_mut(), q, offset)
        };
        offset += BLOCK;
    }
    while offset + LANE <= length {
        // SAFETY: a whole register fits at `offset` in every buffer.
        unsafe { syndrome_lanes::<C, ACCUMULATE, 1>(data, p.as_deref_mut(), q, offset) };
        offset += LANE;
    }
    let tail = Suffix {
        columns: data,
        start: offset,
    };
    let p_tail = p.map(|p| &mut p[offset..]);
    portable::syndromes::<_, ACCUMULATE>(&tail, p_tail, &mut q[offset..]);
}

/// Horner's rule over the present data columns for `LANES` registers at
/// `offset`: returns the P sums and the Q sums, both still in registers.
///
/// # Safety
/// The CPU has AVX2; `offset + LANES * LANE` is within every present column,
/// and there is at least one column.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn horner_lanes<C: DataColumns + ?Sized, const LANES: usize>(
    data: &C,
    offset: usize,
) -> ([__m256i; LANES], [__m256i; LANES]) {
    let top = data.count() - 1;
    let mut p_sum = [_mm256_setzero_si256(); LANES];
    let mut q_sum = p_sum;
    if let Some(column) = data.column(top) {
        for (lane, (p_lane, q_lane)) in p_sum.iter_mut().zip(&mut q_sum).enumerate() {
            // SAFETY: in bounds by this function's contract.
            *p_lane = unsafe { load(column, offset + lane * LANE) };
            *q_lane = *p_lane;
        }
    }
    for index in (0..top).rev() {
        for q_lane in &mut q_sum {
            *q_lane = mul2(*q_lane);
        }
        if let Some(column) = data.column(index) {
            for (lane, (p_lane, q_lane)) in p_sum.iter_mut().zip(&mut q_sum).enumerate() {
                // SAFETY: in bounds by this function's contract.
                let value = unsafe { load(column, offset + lane * LANE) };
                *p_lane = _mm256_xor_si256(*p_lane, value);
                *q_lane = _mm256_xor_si256(*q_lane, value);
            }
        }
    }
    (p_sum, q_sum)
}

/// [`syndromes`] for `LANES` registers at `offset`.
///
/// # Safety
/// The CPU has AVX2; `offset + LANES * LANE` is within `q`, `p` and every
/// present column, and there is at least one column.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn syndrome_lanes<C: DataColumns + ?Sized, const ACCUMULATE: bool, const LANES: usize>(
    data: &C,
    p: Option<&mut [u8]>,
    q: &mut [u8],
    offset: usize,
) {
    // SAFETY: in bounds by this function's contract.
    let (p_sum, q_sum) = unsafe { horner_lanes::<C, LANES>(data, offset) };
    // SAFETY: in bounds by this function's contract.
    unsafe { finish_lanes::<ACCUMULATE>(q, offset, &q_sum) };
    if let Some(p) = p {
        // SAFETY: in bounds by this function's contract.
        unsafe { finish_lanes::<ACCUMULATE>(p, offset, &p_sum) };
    }
}

/// Writes (or with `ACCUMULATE`, XORs in) `sums` at `offset`.
///
/// # Safety
/// The CPU has AVX2; `offset + sums.len() * LANE <= out.len()`.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn finish_lanes<const ACCUMULATE: bool>(out: &mut [u8], offset: usize, sums: &[__m256i]) {
    for (lane, sum) in sums.iter().enumerate() {
        let at = offset + lane * LANE;
        // SAFETY: in bounds by this function's contract.
        unsafe {
            let value = if ACCUMULATE {
                _mm256_xor_si256(*sum, load(out, at))
            } else {
                *sum
            };
            store(out, at, value);
        }
    }
}

/// `destination ^= source`.
///
/// # Safety
/// The CPU has AVX2 and the lengths are equal.
#[target_feature(enable = "avx2")]
unsafe fn xor_into_avx2(destination: &mut [u8], source: &[u8]) {
    let length = destination.len();
    let mut offset = 0;
    while offset + LANE <= length {
        // SAFETY: a whole register fits at `offset` in both buffers.
        unsafe {
            let sum = _mm256_xor_si256(load(destination, offset), load(source, offset));
            store(destination, offset, sum);
        }
        offset += LANE;
    }
    portable::xor_into(&mut destination[offset..], &source[offset..]);
}

/// `destination ^= coefficient · source`.
///
/// # Safety
/// The CPU has AVX2 and the lengths are equal.
#[target_feature(enable = "avx2")]
unsafe fn mul_xor_into_avx2(destination: &mut [u8], source: &[u8], coefficient: u8) {
    let multiplier = multiplier(coefficient);
    let length = destination.len();
    let mut offset = 0;
    while offset + LANE <= length {
        // SAFETY: a whole register fits at `offset` in both buffers.
        unsafe {
            let product = multiply(multiplier, load(source, offset));
            let sum = _mm256_xor_si256(load(destination, offset), product);
            store(destination, offset, sum);
        }
        offset += LANE;
    }
    portable::mul_xor_into(&mut destination[offset..], &source[offset..], coefficient);
}

/// See `Kernels::rebuild_two`: the survivors' syndromes are formed in
/// registers, combined with P and Q, solved and stored, so every buffer is
/// touched once.
///
/// # Safety
/// The CPU has AVX2; `data` has at least one column and every present column
/// and every buffer in `parity` and `lost` is the same length.
#[target_feature(enable = "avx2")]
unsafe fn rebuild_two_avx2(
    data: &ColumnsWithHoles,
    parity: ParityPair,
    lost: LostPair,
    coefficients: [u8; 2],
) {
    let [p, q] = parity;
    let [x, y] = lost;
    let multipliers = [multiplier(coefficients[0]), multiplier(coefficients[1])];
    let length = p.len();
    let mut offset = 0;
    while offset + BLOCK <= length {
        // SAFETY: a whole block fits at `offset` in every buffer.
        unsafe { rebuild_lanes::<LANES_PER_BLOCK>(data, [p, q], [x, y], multipliers, offset) };
        offset += BLOCK;
    }
    while offset + LANE <= length {
        // SAFETY: a whole register fits at `offset` in every buffer.
        unsafe { rebuild_lanes::<1>(data, [p, q], [x, y], multipliers, offset) };
        offset += LANE;
    }
    let tail = Suffix {
        columns: data,
        start: offset,
    };
    portable::rebuild_two_columns(
        &tail,
        [&p[offset..], &q[offset..]],
        [&mut x[offset..], &mut y[offset..]],
        coefficients,
    );
}

/// [`rebuild_two_avx2`] for `LANES` registers at `offset`.
///
/// # Safety
/// The CPU has AVX2; `offset + LANES * LANE` is within every buffer, and
/// there is at least one data column.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn rebuild_lanes<const LANES: usize>(
    data: &ColumnsWithHoles,
    parity: ParityPair,
    lost: LostPair,
    multipliers: [Multiplier; 2],
    offset: usize,
) {
    let [p, q] = parity;
    let [x, y] = lost;
    // SAFETY: in bounds by this function's contract.
    let (p_sum, q_sum) = unsafe { horner_lanes::<_, LANES>(data, offset) };
    for (lane, (p_lane, q_lane)) in p_sum.iter().zip(&q_sum).enumerate() {
        let at = offset + lane * LANE;
        // SAFETY: in bounds by this function's contract.
        unsafe {
            let sum = _mm256_xor_si256(*p_lane, load(p, at));
            let weighted = _mm256_xor_si256(*q_lane, load(q, at));
            let low = _mm256_xor_si256(
                multiply(multipliers[0], sum),
                multiply(multipliers[1], weighted),
            );
            store(x, at, low);
            store(y, at, _mm256_xor_si256(sum, low));
        }
    }
}
