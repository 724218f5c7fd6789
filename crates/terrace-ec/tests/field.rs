//! The field tables against the definition of GF(2^8) modulo 0x11d.

use std::collections::HashSet;

use terrace_ec::field::{self, EXP, GENERATOR, GROUP_ORDER, LOG, POLYNOMIAL};

/// Carry-less multiplication of two bytes as polynomials over GF(2), then
/// reduction modulo 0x11d by long division: written from the definition,
/// independently of the crate's tables.
fn reference_mul(left: u8, right: u8) -> u8 {
    let mut product: u16 = 0;
    for bit in 0..8 {
        if right & (1 << bit) != 0 {
            product ^= u16::from(left) << bit;
        }
    }
    // Clear bits 14 down to 8 by subtracting (XOR-ing) shifted copies of the
    // polynomial, whose top bit is bit 8.
    for bit in (8..15).rev() {
        if product & (1 << bit) != 0 {
            product ^= POLYNOMIAL << (bit - 8);
        }
    }
    u8::try_from(product).expect("reduced below degree 8")
}

#[test]
fn exp_and_log_are_inverse() {
    for value in 1..=255u8 {
        assert_eq!(
            EXP[usize::from(LOG[usize::from(value)])],
            value,
            "value {value:#04x}"
        );
    }
    for exponent in 0..GROUP_ORDER {
        assert_eq!(usize::from(LOG[usize::from(EXP[exponent])]), exponent);
        // The second period repeats the first.
        assert_eq!(EXP[exponent + GROUP_ORDER], EXP[exponent]);
    }
}

#[test]
fn multiplication_matches_carryless_multiplication_for_every_pair() {
    for left in 0..=255u8 {
        for right in 0..=255u8 {
            assert_eq!(
                field::mul(left, right),
                reference_mul(left, right),
                "{left:#04x} · {right:#04x}"
            );
        }
    }
}

#[test]
fn reference_multiplication_agrees_with_hand_computed_products() {
    // 0x80 · 2 = x^8 = x^4 + x^3 + x^2 + 1 = 0x1d.
    assert_eq!(reference_mul(0x80, 2), 0x1d);
    // 0x53 · 0xca, whose reduction takes several steps: the carry-less
    // product of 0x53 and 0xca is 0x3f7e (XOR of 0x53 shifted by 1, 3, 6
    // and 7, the set bits of 0xca). Reducing, bit by bit from the top:
    // 0x3f7e ^ (0x11d << 5) = 0x1cde, ^ (0x11d << 4) = 0x0d0e,
    // ^ (0x11d << 3) = 0x05e6, ^ (0x11d << 2) = 0x0192,
    // ^ (0x11d << 0) = 0x008f.
    assert_eq!(reference_mul(0x53, 0xca), 0x8f);
}

#[test]
fn generator_has_order_255() {
    let mut power = 1u8;
    let mut seen = HashSet::new();
    for exponent in 1..=GROUP_ORDER {
        power = reference_mul(power, GENERATOR);
        seen.insert(power);
        if exponent < GROUP_ORDER {
            assert_ne!(power, 1, "g^{exponent} = 1: g is not primitive");
        }
    }
    assert_eq!(power, 1, "g^255 must be 1");
    assert_eq!(
        seen.len(),
        GROUP_ORDER,
        "the powers of g cover every non-zero byte"
    );
    assert!(!seen.contains(&0));
}

#[test]
fn mul2_inverse_and_division_agree_with_multiplication() {
    for value in 0..=255u8 {
        assert_eq!(field::mul2(value), reference_mul(value, 2));
        if value != 0 {
            assert_eq!(field::mul(value, field::inverse(value)), 1);
            for other in 0..=255u8 {
                assert_eq!(field::mul(field::div(other, value), value), other);
            }
        }
    }
}

#[test]
fn q_coefficients_are_powers_of_two() {
    let mut power = 1u8;
    for column in 0..terrace_ec::MAX_DATA_COLUMNS {
        assert_eq!(terrace_ec::q_coefficient(column), power, "column {column}");
        power = reference_mul(power, 2);
    }
}

#[test]
#[should_panic(expected = "beyond the 253-column limit")]
fn q_coefficient_beyond_the_limit_panics() {
    terrace_ec::q_coefficient(terrace_ec::MAX_DATA_COLUMNS);
}
