//! Parity for terrace stripes: P (XOR) and Q (a Reed-Solomon syndrome over
//! GF(2^8)), the RAID-6 construction.
//!
//! # The stripe
//!
//! A stripe is `k` data columns `D0 … Dk-1` of equal length plus one parity
//! column (P) or two (P and Q) of the same length. Every byte offset `j` is
//! an independent code word; nothing mixes bytes at different offsets.
//!
//! ```text
//!                     data columns                          parity
//!  column      0        1        2     ...    k-1          P        Q
//!          +--------+--------+--------+-----+--------+  +------+ +------+
//!  byte 0  | D0[0]  | D1[0]  | D2[0]  | ... | Dk-1[0]|  | P[0] | | Q[0] |
//!  byte 1  | D0[1]  | D1[1]  | D2[1]  | ... | Dk-1[1]|  | P[1] | | Q[1] |
//!   ...    |  ...   |  ...   |  ...   |     |  ...   |  | ...  | | ...  |
//!          +--------+--------+--------+-----+--------+  +------+ +------+
//!
//!  P[j] =       D0[j] +       D1[j] + ... +           Dk-1[j]
//!  Q[j] = g^0 · D0[j] + g^1 · D1[j] + ... + g^(k-1) · Dk-1[j]
//!
//!  "+" is addition in GF(2^8), which is XOR; "·" is multiplication in GF(2^8).
//! ```
//!
//! In [`reconstruct`] the columns are passed in exactly this order: the `k`
//! data columns, then P, then Q.
//!
//! # The field
//!
//! A byte is read as a polynomial of degree below 8 with coefficients in
//! GF(2) (bit `n` is the coefficient of `x^n`). Addition adds coefficients
//! modulo 2, which is XOR. Multiplication multiplies the polynomials without
//! carries and reduces the result modulo `x^8 + x^4 + x^3 + x^2 + 1` (0x11d).
//! That polynomial is irreducible, so every non-zero byte has an inverse and
//! division works; it is also primitive, meaning the powers of `g = 2` (the
//! polynomial `x`) run through all 255 non-zero bytes before returning to 1.
//! This is the field and generator Linux md raid6 uses, so the parity bytes
//! are the same as md would compute. See [`field`].
//!
//! # Why g = 2
//!
//! * Solving two erasures divides by `g^x ⊕ g^y` (below), so every data column
//!   needs its own distinct, non-zero coefficient. The powers of a generator
//!   give 255 of them.
//! * Multiplying by 2 is a left shift plus, if the top bit fell off, an XOR
//!   with 0x1d (the low byte of 0x11d). That vectorises to a few
//!   instructions, and Horner's rule
//!   `Q = D0 ⊕ g·(D1 ⊕ g·(D2 ⊕ … ⊕ g·Dk-1))` computes Q with nothing but
//!   multiplications by 2 and XORs, in the same pass over the data as P.
//!
//! # The column limit: 253
//!
//! `g` has order 255: `g^255 = g^0 = 1`, so a column 255 would share column
//! 0's coefficient and a double erasure of those two would divide by
//! `g^0 ⊕ g^255 = 0`. The coefficients `g^i` are distinct and non-zero exactly
//! for `i < 255`, which would allow 255 data columns. The limit is
//! [`MAX_DATA_COLUMNS`] = 253 so that a whole stripe, data plus P and Q, is at
//! most 255 columns (the same bound as Linux md raid6) and every column index
//! of a stripe fits in a byte. The public functions assert it.
//!
//! # Reconstruction
//!
//! For erased data columns `x < y`, let `Px`, `Qx` (one erased) and `Pxy`,
//! `Qxy` (two erased) be the partial syndromes: P and Q computed over the
//! surviving data columns only, the erased ones counted as zero.
//!
//! ```text
//!  erased       solved by
//!  ----------   ---------------------------------------------------------
//!  P            P = Σ Di
//!  Q            Q = Σ g^i·Di
//!  P, Q         both, re-encoded in one pass
//!  Dx           Dx = P ⊕ Px                       (Q, if any, is intact)
//!  Dx, Q        Dx = P ⊕ Px, then Q re-encoded
//!  Dx, P        Q ⊕ Qx = g^x·Dx, so Dx = g^-x·(Q ⊕ Qx), then P re-encoded
//!  Dx, Dy       the 2 × 2 system below
//! ```
//!
//! Two data columns: what survives gives two equations in the two unknowns,
//!
//! ```text
//!  P ⊕ Pxy =     Dx ⊕     Dy                                        (1)
//!  Q ⊕ Qxy = g^x·Dx ⊕ g^y·Dy                                        (2)
//! ```
//!
//! Multiply (1) by `g^y` and add it to (2); the `Dy` terms cancel:
//!
//! ```text
//!  g^y·(P ⊕ Pxy) ⊕ (Q ⊕ Qxy) = (g^x ⊕ g^y)·Dx
//!
//!  Dx = A·(P ⊕ Pxy) ⊕ B·(Q ⊕ Qxy)   with   B = 1 / (g^x ⊕ g^y),   A = g^y·B
//!  Dy = (P ⊕ Pxy) ⊕ Dx                                              from (1)
//! ```
//!
//! Dividing numerator and denominator by `g^x` gives the same constants in
//! the form md uses: `A = g^(y-x) / (g^(y-x) ⊕ 1)`, `B = g^-x / (g^(y-x) ⊕ 1)`.
//! `g^x ⊕ g^y` is non-zero because `x ≠ y` and both are below 255.
//!
//! The fast path allocates nothing: the erased buffers hold the partial
//! syndromes while they are solved. `Dx`'s buffer receives `P ⊕ Pxy`, `Dy`'s
//! receives `Q ⊕ Qxy` (one Horner pass over the survivors), and one more pass
//! over those two buffers turns them into `Dx` and `Dy`.
//!
//! # Implementations
//!
//! * [`scalar`]: byte at a time, straight from the definitions. The oracle for
//!   the tests; never selected for real work.
//! * `avx2` (x86-64 only, used when the CPU has AVX2): 32 bytes per instruction. Q by Horner's rule
//!   with a vectorised multiply-by-2; general multiplication by splitting each
//!   byte into nibbles and looking both up with a byte shuffle.
//! * [`portable`]: any CPU. Eight bytes at a time in a `u64`, general
//!   multiplication through a product table.
//!
//! The functions at the crate root use the best implementation the CPU
//! supports, chosen once on first use; [`implementation`] names it. Each
//! module exposes the same functions so tests can call every one explicitly.

pub mod field;
pub mod portable;
pub mod scalar;

#[cfg(target_arch = "x86_64")]
pub mod avx2;

mod check;
mod kernel;
mod solve;

use std::sync::OnceLock;

use kernel::Kernels;

/// Parity columns at most: P and Q, the two syndromes of the RAID-6 code this
/// crate implements. Tolerating a third failure would take a different code.
pub const MAX_PARITY: usize = 2;

/// Data columns per stripe at most: 253, so a full stripe including P and Q
/// is at most 255 columns (see "The column limit" above). The hard bound is
/// the 255 distinct non-zero powers of g.
pub const MAX_DATA_COLUMNS: usize = 253;

/// Why a reconstruction was refused. Nothing is written when one is returned.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EcError {
    /// More columns were erased than there are parity columns to solve for.
    #[error("{erased} columns erased but the stripe has only {parity} parity columns")]
    TooManyErasures { erased: usize, parity: usize },
    /// A column's length differs from the first column's.
    #[error("column {column} is {actual} bytes, expected {expected}")]
    LengthMismatch {
        column: usize,
        expected: usize,
        actual: usize,
    },
    /// An erased index does not name a column of the stripe.
    #[error("erased index {index} is out of range for a stripe of {columns} columns")]
    BadIndex { index: usize, columns: usize },
    /// The same column was listed as erased twice.
    #[error("column {index} is listed as erased more than once")]
    DuplicateIndex { index: usize },
    /// Parity must be 1 (P) or 2 (P and Q).
    #[error("parity must be 1 or 2, not {parity}")]
    BadParity { parity: usize },
    /// The stripe has more data columns than Q can tell apart.
    #[error("{data_columns} data columns; at most {max} are supported")]
    TooManyColumns { data_columns: usize, max: usize },
    /// The stripe has no data columns (only parity, or nothing).
    #[error("the stripe has no data columns")]
    NoDataColumns,
}

/// The implementation chosen for this CPU, selected on first use.
fn kernels() -> &'static Kernels {
    static SELECTED: OnceLock<&'static Kernels> = OnceLock::new();
    SELECTED.get_or_init(select)
}

fn select() -> &'static Kernels {
    #[cfg(target_arch = "x86_64")]
    if avx2::is_available() {
        return &avx2::KERNELS;
    }
    &portable::KERNELS
}

/// Name of the implementation selected at run time: `"avx2"` or
/// `"portable-u64"`.
pub fn implementation() -> &'static str {
    kernels().name
}

/// P only (single parity): `p` = XOR of the data columns.
///
/// Panics unless there are 1 to [`MAX_DATA_COLUMNS`] data columns, each as
/// long as `p`.
pub fn encode_p(data: &[&[u8]], p: &mut [u8]) {
    check::data_columns(data, p.len());
    (kernels().encode_p)(data, p);
}

/// P and Q in one pass over the data: `p = Σ data[i]`,
/// `q = Σ g^i · data[i]`.
///
/// Panics unless there are 1 to [`MAX_DATA_COLUMNS`] data columns and every
/// buffer has the same length.
pub fn encode_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    (kernels().encode_pq)(data, p, q);
}

/// `destination ^= source`. Panics if the lengths differ.
///
/// With [`mul_xor_into`] this updates parity for a partial write:
/// `P ^= old ⊕ new`, `Q ^= g^i · (old ⊕ new)` for data column `i`.
pub fn xor_into(destination: &mut [u8], source: &[u8]) {
    (kernels().xor_into)(destination, source);
}

/// `destination ^= coefficient · source`, multiplication in GF(2^8). Panics
/// if the lengths differ.
pub fn mul_xor_into(destination: &mut [u8], source: &[u8], coefficient: u8) {
    (kernels().mul_xor_into)(destination, source, coefficient);
}

/// `g^column`: the Q coefficient of data column `column`.
///
/// Panics if `column >= MAX_DATA_COLUMNS`.
pub fn q_coefficient(column: usize) -> u8 {
    assert!(
        column < MAX_DATA_COLUMNS,
        "data column {column} is beyond the {MAX_DATA_COLUMNS}-column limit"
    );
    field::exp(column)
}

/// Rebuilds the erased columns of one stripe in place.
///
/// `columns` holds the `k` data columns in order, then P, then Q if
/// `parity == 2`, so `columns.len() == k + parity`. `erased` lists the indices
/// into `columns` whose contents are lost; those buffers are overwritten and
/// the others are only read. Any pattern of at most `parity` erasures works;
/// the solution of each is in the crate documentation.
///
/// Returns an error, without writing anything, if `parity` is not 1 or 2, if
/// more than `parity` columns are erased, if an index is out of range or
/// repeated, if the columns differ in length, or if the number of data
/// columns is not 1 to [`MAX_DATA_COLUMNS`].
pub fn reconstruct(
    columns: &mut [&mut [u8]],
    parity: usize,
    erased: &[usize],
) -> Result<(), EcError> {
    solve::reconstruct(kernels(), columns, parity, erased)
}
