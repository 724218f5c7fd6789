//! The portable implementation, for CPUs without a SIMD implementation here:
//! eight bytes at a time in a `u64` ("SIMD within a register").
//!
//! XOR needs nothing special: XOR of two words is XOR of their eight bytes.
//! Multiplication by 2 is done on all eight bytes at once (see `mul2_word`),
//! which is all Horner's rule needs for Q. A general multiplication by a
//! coefficient has no such trick, so it uses one 256-byte row of the product
//! table per call: one lookup per byte.
//!
//! The syndrome and XOR kernels here are generic over `DataColumns` so the
//! SIMD implementations can hand them the tail of a buffer too short for a
//! full vector.

use crate::check;
use crate::field::{self, MUL_TABLE, REDUCTION};
use crate::kernel::{ColumnsWithHoles, DataColumns, Kernels, LostPair, ParityPair};
use crate::EcError;

/// Bytes in one machine word.
const WORD: usize = std::mem::size_of::<u64>();

/// Words processed together. Horner's rule is a chain of dependent steps per
/// word; four independent chains keep the CPU's arithmetic units busy while
/// each one waits on its previous step.
const WORDS_PER_BLOCK: usize = 4;

/// The top bit of every byte of a word.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The low seven bits of every byte: what survives a left shift by one
/// without crossing into the next byte.
const LOW_BITS: u64 = 0x7f7f_7f7f_7f7f_7f7f;

/// The kernels of this implementation, for the dispatcher and for `solve`.
pub(crate) static KERNELS: Kernels = Kernels {
    name: "portable-u64",
    encode_p: xor_sources,
    encode_q,
    encode_pq,
    accumulate_q,
    rebuild_two,
    xor_into,
    mul_xor_into,
};

/// Multiplies each of the eight bytes of `word` by 2 in GF(2^8).
///
/// Per byte: shift left by one, and where the top bit fell off, XOR in the
/// reduction 0x1d. `(word & HIGH_BITS) >> 7` has 0x01 in exactly the bytes
/// that overflowed; multiplying it by 0x1d puts 0x1d in those bytes and
/// cannot carry into a neighbour, because 0x01 · 0x1d fits in a byte.
#[inline]
pub(crate) fn mul2_word(word: u64) -> u64 {
    let overflowed = (word & HIGH_BITS) >> 7;
    ((word & LOW_BITS) << 1) ^ (overflowed * u64::from(REDUCTION))
}

#[inline]
fn load(bytes: &[u8], offset: usize) -> u64 {
    let mut word = [0; WORD];
    word.copy_from_slice(&bytes[offset..offset + WORD]);
    u64::from_ne_bytes(word)
}

#[inline]
fn store(bytes: &mut [u8], offset: usize, word: u64) {
    bytes[offset..offset + WORD].copy_from_slice(&word.to_ne_bytes());
}

/// `p` = XOR of the data columns.
pub fn encode_p(data: &[&[u8]], p: &mut [u8]) {
    check::data_columns(data, p.len());
    xor_columns(data, p);
}

/// `p` = XOR of the data columns, `q = Σ g^i · data[i]`, in one pass.
pub fn encode_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    check::data_columns(data, q.len());
    check::same_length(p, q);
    syndromes::<_, false>(data, Some(p), q);
}

/// `destination ^= source`.
pub fn xor_into(destination: &mut [u8], source: &[u8]) {
    check::same_length(destination, source);
    let whole = destination.len() - destination.len() % WORD;
    for offset in (0..whole).step_by(WORD) {
        let word = load(destination, offset) ^ load(source, offset);
        store(destination, offset, word);
    }
    for (target, byte) in destination[whole..].iter_mut().zip(&source[whole..]) {
        *target ^= byte;
    }
}

/// `destination ^= coefficient · source`.
pub fn mul_xor_into(destination: &mut [u8], source: &[u8], coefficient: u8) {
    check::same_length(destination, source);
    match coefficient {
        0 => {}
        1 => xor_into(destination, source),
        _ => {
            let row = &MUL_TABLE[usize::from(coefficient)];
            for (target, byte) in destination.iter_mut().zip(source) {
                *target ^= row[usize::from(*byte)];
            }
        }
    }
}

/// Rebuilds the erased columns of a stripe; see [`crate::reconstruct`].
pub fn reconstruct(
    columns: &mut [&mut [u8]],
    parity: usize,
    erased: &[usize],
) -> Result<(), EcError> {
    crate::solve::reconstruct(&KERNELS, columns, parity, erased)
}

/// The kernel behind P: XOR of any list of sources (P included when a
/// data column is rebuilt from it).
fn xor_sources(sources: &[&[u8]], out: &mut [u8]) {
    check::sources(sources, out.len());
    xor_columns(sources, out);
}

fn encode_q(data: &[&[u8]], q: &mut [u8]) {
    check::data_columns(data, q.len());
    syndromes::<_, false>(data, None, q);
}

fn accumulate_q(data: &[Option<&[u8]>], q: &mut [u8]) {
    check::present_columns(data, q.len());
    syndromes::<_, true>(data, None, q);
}

/// See [`Kernels::rebuild_two`].
fn rebuild_two(data: &ColumnsWithHoles, parity: ParityPair, lost: LostPair, coefficients: [u8; 2]) {
    check::present_columns(data, parity[0].len());
    for buffer in parity.iter().chain([&*lost[0], &*lost[1]].iter()) {
        check::same_length(buffer, parity[0]);
    }
    rebuild_two_columns(data, parity, lost, coefficients);
}

/// [`rebuild_two`] without the checks, for any column view. Here in three
/// steps: the erased buffers are seeded with P and Q, the survivors'
/// syndromes are XOR-ed in, and the 2 × 2 system is solved byte by byte.
pub(crate) fn rebuild_two_columns<C: DataColumns + ?Sized>(
    data: &C,
    parity: ParityPair,
    lost: LostPair,
    coefficients: [u8; 2],
) {
    let [p, q] = parity;
    let [x, y] = lost;
    x.copy_from_slice(p);
    y.copy_from_slice(q);
    syndromes::<_, true>(data, Some(&mut *x), y);
    let [a, b] = coefficients;
    solve_two(x, y, a, b);
}

/// `out` = XOR of the present columns.
pub(crate) fn xor_columns<C: DataColumns + ?Sized>(sources: &C, out: &mut [u8]) {
    let length = out.len();
    let whole = length - length % WORD;
    for offset in (0..whole).step_by(WORD) {
        let mut sum = 0;
        for index in 0..sources.count() {
            if let Some(column) = sources.column(index) {
                sum ^= load(column, offset);
            }
        }
        store(out, offset, sum);
    }
    for offset in whole..length {
        let mut sum = 0;
        for index in 0..sources.count() {
            if let Some(column) = sources.column(index) {
                sum ^= column[offset];
            }
        }
        out[offset] = sum;
    }
}

/// The syndromes of the present data columns: `q = Σ g^i · data[i]` and, if
/// asked for, `p = Σ data[i]`. With `ACCUMULATE` they are XOR-ed into the
/// outputs instead of overwriting them.
///
/// Q is evaluated by Horner's rule from the highest column down,
/// `q = (((D[k-1])·g ⊕ D[k-2])·g ⊕ …)·g ⊕ D[0]`, so only multiplication by g = 2
/// is needed; an absent column contributes its multiplication but no XOR.
pub(crate) fn syndromes<C: DataColumns + ?Sized, const ACCUMULATE: bool>(
    data: &C,
    mut p: Option<&mut [u8]>,
    q: &mut [u8],
) {
    let length = q.len();
    let block = WORD * WORDS_PER_BLOCK;
    let mut offset = 0;
    while offset + block <= length {
        syndrome_words::<C, ACCUMULATE, WORDS_PER_BLOCK>(data, p.as_deref_mut(), q, offset);
        offset += block;
    }
    while offset + WORD <= length {
        syndrome_words::<C, ACCUMULATE, 1>(data, p.as_deref_mut(), q, offset);
        offset += WORD;
    }
    while offset < length {
        syndrome_byte::<C, ACCUMULATE>(data, p.as_deref_mut(), q, offset);
        offset += 1;
    }
}

/// [`syndromes`] for `WORDS` words starting at `offset`.
#[inline]
fn syndrome_words<C: DataColumns + ?Sized, const ACCUMULATE: bool, const WORDS: usize>(
    data: &C,
    p: Option<&mut [u8]>,
    q: &mut [u8],
    offset: usize,
) {
    let top = data.count() - 1;
    let mut p_sum = [0u64; WORDS];
    let mut q_sum = [0u64; WORDS];
    if let Some(column) = data.column(top) {
        for (word, (p_word, q_word)) in p_sum.iter_mut().zip(&mut q_sum).enumerate() {
            *p_word = load(column, offset + word * WORD);
            *q_word = *p_word;
        }
    }
    for index in (0..top).rev() {
        for q_word in &mut q_sum {
            *q_word = mul2_word(*q_word);
        }
        if let Some(column) = data.column(index) {
            for (word, (p_word, q_word)) in p_sum.iter_mut().zip(&mut q_sum).enumerate() {
                let value = load(column, offset + word * WORD);
                *p_word ^= value;
                *q_word ^= value;
            }
        }
    }
    for (word, q_word) in q_sum.iter().enumerate() {
        let at = offset + word * WORD;
        store(
            q,
            at,
            if ACCUMULATE {
                q_word ^ load(q, at)
            } else {
                *q_word
            },
        );
    }
    if let Some(p) = p {
        for (word, p_word) in p_sum.iter().enumerate() {
            let at = offset + word * WORD;
            store(
                p,
                at,
                if ACCUMULATE {
                    p_word ^ load(p, at)
                } else {
                    *p_word
                },
            );
        }
    }
}

/// [`syndromes`] for the single byte at `offset`.
fn syndrome_byte<C: DataColumns + ?Sized, const ACCUMULATE: bool>(
    data: &C,
    p: Option<&mut [u8]>,
    q: &mut [u8],
    offset: usize,
) {
    let mut p_sum = 0;
    let mut q_sum = 0;
    for index in (0..data.count()).rev() {
        q_sum = field::mul2(q_sum);
        if let Some(column) = data.column(index) {
            p_sum ^= column[offset];
            q_sum ^= column[offset];
        }
    }
    q[offset] = if ACCUMULATE { q[offset] ^ q_sum } else { q_sum };
    if let Some(p) = p {
        p[offset] = if ACCUMULATE { p[offset] ^ p_sum } else { p_sum };
    }
}

/// `x = A·x ⊕ B·y`, then `y = old x ⊕ new x`: with `x = Dx ⊕ Dy` and
/// `y = g^x·Dx ⊕ g^y·Dy` that leaves `Dx` and `Dy`.
fn solve_two(x: &mut [u8], y: &mut [u8], a: u8, b: u8) {
    check::same_length(x, y);
    let a_row = &MUL_TABLE[usize::from(a)];
    let b_row = &MUL_TABLE[usize::from(b)];
    for (x_byte, y_byte) in x.iter_mut().zip(y.iter_mut()) {
        let low = a_row[usize::from(*x_byte)] ^ b_row[usize::from(*y_byte)];
        *y_byte = *x_byte ^ low;
        *x_byte = low;
    }
}
