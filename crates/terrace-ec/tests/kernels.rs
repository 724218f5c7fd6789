//! Every fast implementation against the scalar reference, kernel by kernel.

mod common;

use common::{as_slices, fast_implementations, scalar, Random};

/// Lengths around every boundary the kernels care about: empty, below one
/// u64 word, around one AVX2 register (32), around a 128-byte block, a page,
/// a page plus an awkward tail, and a large buffer.
const LENGTHS: [usize; 11] = [0, 1, 7, 31, 32, 33, 63, 129, 4096, 4096 + 17, 65536];

/// Data column counts: every small one, plus wider stripes.
fn column_counts() -> impl Iterator<Item = usize> {
    (1..=16).chain([64])
}

#[test]
fn dispatch_picks_the_best_available_implementation() {
    #[cfg(target_arch = "x86_64")]
    if terrace_ec::avx2::is_available() {
        assert_eq!(terrace_ec::implementation(), "avx2");
        return;
    }
    assert_eq!(terrace_ec::implementation(), "portable-u64");
}

#[test]
fn encode_p_matches_reference() {
    let oracle = scalar();
    let mut random = Random::new(1);
    for implementation in fast_implementations() {
        for &length in &LENGTHS {
            for data_columns in column_counts() {
                let data = random.columns(data_columns, length);
                let mut expected = vec![0; length];
                (oracle.encode_p)(&as_slices(&data), &mut expected);
                // Start from garbage: the output must be overwritten, not accumulated.
                let mut p = random.bytes(length);
                (implementation.encode_p)(&as_slices(&data), &mut p);
                assert!(
                    p == expected,
                    "{}: encode_p, k = {data_columns}, length {length}",
                    implementation.name
                );
            }
        }
    }
}

#[test]
fn encode_pq_matches_reference() {
    let oracle = scalar();
    let mut random = Random::new(2);
    for implementation in fast_implementations() {
        for &length in &LENGTHS {
            for data_columns in column_counts() {
                let data = random.columns(data_columns, length);
                let mut expected_p = vec![0; length];
                let mut expected_q = vec![0; length];
                (oracle.encode_pq)(&as_slices(&data), &mut expected_p, &mut expected_q);
                let mut p = random.bytes(length);
                let mut q = random.bytes(length);
                (implementation.encode_pq)(&as_slices(&data), &mut p, &mut q);
                let context = format!(
                    "{}: k = {data_columns}, length {length}",
                    implementation.name
                );
                assert!(p == expected_p, "{context}: P differs");
                assert!(q == expected_q, "{context}: Q differs");
            }
        }
    }
}

#[test]
fn encode_pq_handles_the_widest_stripe_and_misaligned_buffers() {
    let oracle = scalar();
    let mut random = Random::new(3);
    let length = 300;
    let data_columns = terrace_ec::MAX_DATA_COLUMNS;
    // One extra byte in front of each column so no slice starts aligned.
    let backing = random.columns(data_columns, length + 1);
    let data: Vec<&[u8]> = backing.iter().map(|column| &column[1..]).collect();
    let mut expected_p = vec![0; length];
    let mut expected_q = vec![0; length];
    (oracle.encode_pq)(&data, &mut expected_p, &mut expected_q);
    for implementation in fast_implementations() {
        let mut p = vec![0; length + 3];
        let mut q = vec![0; length + 5];
        (implementation.encode_pq)(&data, &mut p[3..], &mut q[5..]);
        assert!(p[3..] == expected_p[..], "{}: P", implementation.name);
        assert!(q[5..] == expected_q[..], "{}: Q", implementation.name);
        let mut p_only = vec![0; length + 1];
        (implementation.encode_p)(&data, &mut p_only[1..]);
        assert!(
            p_only[1..] == expected_p[..],
            "{}: P only",
            implementation.name
        );
    }
}

#[test]
fn xor_into_matches_reference() {
    let oracle = scalar();
    let mut random = Random::new(4);
    for implementation in fast_implementations() {
        for &length in &LENGTHS {
            let source = random.bytes(length);
            let start = random.bytes(length);
            let mut expected = start.clone();
            (oracle.xor_into)(&mut expected, &source);
            let mut destination = start.clone();
            (implementation.xor_into)(&mut destination, &source);
            assert!(
                destination == expected,
                "{}: length {length}",
                implementation.name
            );
            if length > 0 {
                assert_ne!(destination, start, "XOR with random bytes changed nothing");
            }
        }
    }
}

#[test]
fn mul_xor_into_matches_reference_for_every_coefficient() {
    let oracle = scalar();
    let mut random = Random::new(5);
    for implementation in fast_implementations() {
        for &length in &LENGTHS {
            let source = random.bytes(length);
            let start = random.bytes(length);
            for coefficient in 0..=255u8 {
                let mut expected = start.clone();
                (oracle.mul_xor_into)(&mut expected, &source, coefficient);
                let mut destination = start.clone();
                (implementation.mul_xor_into)(&mut destination, &source, coefficient);
                assert!(
                    destination == expected,
                    "{}: coefficient {coefficient:#04x}, length {length}",
                    implementation.name
                );
            }
        }
    }
}

#[test]
fn every_byte_value_multiplies_correctly() {
    // A source holding each byte value once, so each coefficient meets each
    // value in every position of a register.
    let source: Vec<u8> = (0..=255u8).cycle().take(256 * 3 + 5).collect();
    let oracle = scalar();
    for implementation in fast_implementations() {
        for coefficient in 0..=255u8 {
            let mut expected = vec![0; source.len()];
            (oracle.mul_xor_into)(&mut expected, &source, coefficient);
            let mut destination = vec![0; source.len()];
            (implementation.mul_xor_into)(&mut destination, &source, coefficient);
            assert!(
                destination == expected,
                "{}: {coefficient:#04x}",
                implementation.name
            );
        }
    }
}

#[test]
fn partial_write_parity_update_equals_reencoding() {
    // The read-modify-write rule the public docs give: replacing data column
    // i changes P by (old ⊕ new) and Q by g^i · (old ⊕ new).
    let mut random = Random::new(6);
    let length = 1000;
    let mut data = random.columns(6, length);
    let mut p = vec![0; length];
    let mut q = vec![0; length];
    terrace_ec::encode_pq(&as_slices(&data), &mut p, &mut q);
    let column = 4;
    let new = random.bytes(length);
    let mut delta = data[column].clone();
    terrace_ec::xor_into(&mut delta, &new);
    terrace_ec::xor_into(&mut p, &delta);
    terrace_ec::mul_xor_into(&mut q, &delta, terrace_ec::q_coefficient(column));
    data[column] = new;
    let mut expected_p = vec![0; length];
    let mut expected_q = vec![0; length];
    terrace_ec::scalar::encode_pq(&as_slices(&data), &mut expected_p, &mut expected_q);
    assert_eq!(p, expected_p);
    assert_eq!(q, expected_q);
}

#[test]
#[should_panic(expected = "data column 1 is 11 bytes but the parity is 10")]
fn encode_with_unequal_lengths_panics() {
    let data = [vec![0u8; 10], vec![0u8; 11]];
    let mut p = vec![0; 10];
    let mut q = vec![0; 10];
    terrace_ec::encode_pq(&as_slices(&data), &mut p, &mut q);
}

#[test]
#[should_panic(expected = "a stripe has 1..=253 data columns, got 254")]
fn encode_with_too_many_columns_panics() {
    let data = vec![vec![0u8; 4]; terrace_ec::MAX_DATA_COLUMNS + 1];
    let mut p = vec![0; 4];
    terrace_ec::encode_p(&as_slices(&data), &mut p);
}

#[test]
#[should_panic(expected = "destination is 3 bytes, source is 4")]
fn mul_xor_into_with_unequal_lengths_panics() {
    terrace_ec::mul_xor_into(&mut [0; 3], &[0; 4], 7);
}
