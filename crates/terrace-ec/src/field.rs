//! Arithmetic in GF(2^8) modulo x^8 + x^4 + x^3 + x^2 + 1 (0x11d).
//!
//! Elements are bytes. Addition is XOR. Multiplication is carry-less
//! multiplication of the two bytes as polynomials over GF(2), reduced modulo
//! the field polynomial. Every table here is built at compile time from one
//! primitive: [`mul2`], multiplication by the generator 2.
//!
//! The tables:
//!
//! * [`EXP`]: `EXP[n] = 2^n`, stored for `n` in `0..510` so that
//!   `EXP[LOG[a] + LOG[b]]` never needs a `% 255`.
//! * [`LOG`]: the inverse of `EXP` on the non-zero bytes.
//! * `MUL_TABLE`: the full 256 × 256 product table, one row per coefficient,
//!   used by the portable kernels (one lookup per byte).
//! * `NIBBLE_LOW` / `NIBBLE_HIGH`: for each coefficient `c`, the products
//!   `c · n` and `c · (n << 4)` for the sixteen 4-bit values `n`. Because
//!   multiplication distributes over XOR, `c · b = c · (b & 0x0f) ⊕ c · (b & 0xf0)`,
//!   so two 16-entry lookups give any product. Sixteen entries is exactly
//!   what one byte shuffle (`pshufb`) can look up in parallel.

/// The field polynomial x^8 + x^4 + x^3 + x^2 + 1. It is irreducible and
/// primitive (2 generates the whole multiplicative group), and it is the
/// polynomial Linux md raid6 uses, so parity written by either is the same.
pub const POLYNOMIAL: u16 = 0x11d;

/// The low eight bits of [`POLYNOMIAL`]: what to XOR into a byte whose top bit
/// was shifted out (x^8 ≡ x^4 + x^3 + x^2 + 1 modulo the polynomial).
pub const REDUCTION: u8 = (POLYNOMIAL & 0xff) as u8;

/// The generator g of the Q syndrome. 2 (the polynomial x) is primitive for
/// 0x11d, and multiplying by it is a shift plus a conditional XOR, which is
/// what makes Horner-rule Q encoding cheap.
pub const GENERATOR: u8 = 2;

/// Size of the multiplicative group: the 255 non-zero bytes. Powers of the
/// generator repeat with this period.
pub const GROUP_ORDER: usize = 255;

/// Length of [`EXP`]: two periods, so the sum of two logarithms (at most
/// 254 + 254) indexes it directly.
const EXP_LENGTH: usize = 2 * GROUP_ORDER;

/// Multiply by the generator 2: shift left, and if the top bit fell off,
/// reduce by XOR-ing the low bits of the polynomial.
#[inline]
pub const fn mul2(value: u8) -> u8 {
    let shifted = value << 1;
    if value & 0x80 != 0 {
        shifted ^ REDUCTION
    } else {
        shifted
    }
}

const fn build_exp() -> [u8; EXP_LENGTH] {
    let mut table = [0u8; EXP_LENGTH];
    let mut power = 1u8;
    let mut exponent = 0;
    while exponent < EXP_LENGTH {
        table[exponent] = power;
        power = mul2(power);
        exponent += 1;
    }
    table
}

const fn build_log(exp: &[u8; EXP_LENGTH]) -> [u8; 256] {
    // LOG[0] has no meaning (0 is not a power of g); it is left 0 and every
    // user checks for a zero operand first.
    let mut table = [0u8; 256];
    let mut exponent = 0;
    while exponent < GROUP_ORDER {
        table[exp[exponent] as usize] = exponent as u8;
        exponent += 1;
    }
    table
}

const EXP_CONST: [u8; EXP_LENGTH] = build_exp();
const LOG_CONST: [u8; 256] = build_log(&EXP_CONST);

/// `EXP[n] = g^n` for `n` in `0..510` (two periods of the group).
pub static EXP: [u8; EXP_LENGTH] = EXP_CONST;

/// `LOG[a] = n` such that `g^n = a`, for non-zero `a`. `LOG[0]` is meaningless.
pub static LOG: [u8; 256] = LOG_CONST;

const fn mul_const(left: u8, right: u8) -> u8 {
    if left == 0 || right == 0 {
        0
    } else {
        EXP_CONST[LOG_CONST[left as usize] as usize + LOG_CONST[right as usize] as usize]
    }
}

const fn build_mul_table() -> [[u8; 256]; 256] {
    let mut table = [[0u8; 256]; 256];
    let mut coefficient = 0;
    while coefficient < 256 {
        let mut value = 0;
        while value < 256 {
            table[coefficient][value] = mul_const(coefficient as u8, value as u8);
            value += 1;
        }
        coefficient += 1;
    }
    table
}

/// Which half of a byte a nibble table covers.
const LOW_NIBBLE_SHIFT: u32 = 0;
const HIGH_NIBBLE_SHIFT: u32 = 4;

const fn build_nibble_table(shift: u32) -> [[u8; 16]; 256] {
    let mut table = [[0u8; 16]; 256];
    let mut coefficient = 0;
    while coefficient < 256 {
        let mut nibble = 0;
        while nibble < 16 {
            table[coefficient][nibble] = mul_const(coefficient as u8, (nibble as u8) << shift);
            nibble += 1;
        }
        coefficient += 1;
    }
    table
}

/// `MUL_TABLE[c][b] = c · b`. 64 KiB; a kernel touches one 256-byte row.
pub(crate) static MUL_TABLE: [[u8; 256]; 256] = build_mul_table();

/// `NIBBLE_LOW[c][n] = c · n` for the low nibble `n`.
pub(crate) static NIBBLE_LOW: [[u8; 16]; 256] = build_nibble_table(LOW_NIBBLE_SHIFT);

/// `NIBBLE_HIGH[c][n] = c · (n << 4)` for the high nibble `n`.
pub(crate) static NIBBLE_HIGH: [[u8; 16]; 256] = build_nibble_table(HIGH_NIBBLE_SHIFT);

/// Product of two field elements.
#[inline]
pub fn mul(left: u8, right: u8) -> u8 {
    if left == 0 || right == 0 {
        0
    } else {
        EXP[usize::from(LOG[usize::from(left)]) + usize::from(LOG[usize::from(right)])]
    }
}

/// `g^exponent` for any exponent (reduced modulo the group order).
#[inline]
pub fn exp(exponent: usize) -> u8 {
    EXP[exponent % GROUP_ORDER]
}

/// Multiplicative inverse. Panics on 0, which has none.
#[inline]
pub fn inverse(value: u8) -> u8 {
    assert!(value != 0, "0 has no inverse in GF(2^8)");
    // g^n · g^(255 - n) = g^255 = 1.
    EXP[GROUP_ORDER - usize::from(LOG[usize::from(value)])]
}

/// `numerator / denominator`. Panics if the denominator is 0.
#[inline]
pub fn div(numerator: u8, denominator: u8) -> u8 {
    mul(numerator, inverse(denominator))
}
