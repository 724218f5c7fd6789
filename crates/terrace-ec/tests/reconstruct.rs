//! Reconstruction: every erasure pattern, the error cases, random stripes,
//! and a known-answer vector.

mod common;

use common::{all_implementations, as_slices, encoded_stripe, erasure_patterns, Random};
use proptest::prelude::*;
use terrace_ec::{EcError, MAX_DATA_COLUMNS};

/// Not a multiple of anything the kernels use: two 128-byte blocks, one
/// 32-byte register, one word and five stray bytes.
const LENGTH: usize = 128 * 2 + 32 + 8 + 5;

/// Erases `erased` in a copy of `stripe` (filling the columns with garbage),
/// reconstructs with `reconstruct`, and returns the result.
fn wipe_and_rebuild(
    reconstruct: common::Reconstruct,
    stripe: &[Vec<u8>],
    parity: usize,
    erased: &[usize],
    random: &mut Random,
) -> Result<Vec<Vec<u8>>, EcError> {
    let mut damaged = stripe.to_vec();
    for &index in erased {
        random.fill(&mut damaged[index]);
    }
    let mut columns: Vec<&mut [u8]> = damaged.iter_mut().map(Vec::as_mut_slice).collect();
    reconstruct(&mut columns, parity, erased)?;
    Ok(damaged)
}

#[test]
fn every_erasure_pattern_is_rebuilt_by_every_implementation() {
    let mut random = Random::new(10);
    for implementation in all_implementations() {
        for parity in 1..=2 {
            for data_columns in 1..=12 {
                let stripe = encoded_stripe(&mut random, data_columns, parity, LENGTH);
                for erased in erasure_patterns(data_columns + parity, parity) {
                    let reversed: Vec<usize> = erased.iter().rev().copied().collect();
                    for order in [&erased, &reversed] {
                        let rebuilt = wipe_and_rebuild(
                            implementation.reconstruct,
                            &stripe,
                            parity,
                            order,
                            &mut random,
                        )
                        .unwrap();
                        assert!(
                            rebuilt == stripe,
                            "{}: k = {data_columns}, parity {parity}, erased {order:?}",
                            implementation.name
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn widest_stripe_rebuilds_far_columns() {
    // The highest coefficients g^251, g^252 and the pair (0, 252) exercise
    // the far end of the exponent table.
    let mut random = Random::new(11);
    let data_columns = MAX_DATA_COLUMNS;
    let stripe = encoded_stripe(&mut random, data_columns, 2, 100);
    let p = data_columns;
    let q = data_columns + 1;
    for implementation in all_implementations() {
        for erased in [[251, 252], [0, 252], [252, p], [252, q], [p, q], [0, 1]] {
            let rebuilt =
                wipe_and_rebuild(implementation.reconstruct, &stripe, 2, &erased, &mut random)
                    .unwrap();
            assert!(
                rebuilt == stripe,
                "{}: erased {erased:?}",
                implementation.name
            );
        }
    }
}

#[test]
fn empty_columns_and_large_columns_are_rebuilt() {
    let mut random = Random::new(12);
    for length in [0, 1, 65536 + 3] {
        let stripe = encoded_stripe(&mut random, 6, 2, length);
        for implementation in all_implementations() {
            for erased in [vec![1, 4], vec![2, 6], vec![5, 7], vec![6, 7], vec![0]] {
                let rebuilt =
                    wipe_and_rebuild(implementation.reconstruct, &stripe, 2, &erased, &mut random)
                        .unwrap();
                assert!(
                    rebuilt == stripe,
                    "{}: length {length}, erased {erased:?}",
                    implementation.name
                );
            }
        }
    }
}

/// Runs `reconstruct` on a copy of `stripe` and checks it fails with
/// `expected` without touching any buffer.
fn assert_refused(stripe: &[Vec<u8>], parity: usize, erased: &[usize], expected: &EcError) {
    for implementation in all_implementations() {
        let mut copy = stripe.to_vec();
        let mut columns: Vec<&mut [u8]> = copy.iter_mut().map(Vec::as_mut_slice).collect();
        let result = (implementation.reconstruct)(&mut columns, parity, erased);
        assert_eq!(
            result.as_ref(),
            Err(expected),
            "{}: {erased:?}",
            implementation.name
        );
        assert!(
            copy == stripe,
            "{}: a refused call wrote",
            implementation.name
        );
    }
}

#[test]
fn bad_requests_are_refused_without_panicking() {
    let mut random = Random::new(13);
    let stripe = encoded_stripe(&mut random, 4, 2, 40);
    assert_refused(
        &stripe,
        2,
        &[0, 1, 2],
        &EcError::TooManyErasures {
            erased: 3,
            parity: 2,
        },
    );
    assert_refused(&stripe, 2, &[1, 1], &EcError::DuplicateIndex { index: 1 });
    assert_refused(
        &stripe,
        2,
        &[6],
        &EcError::BadIndex {
            index: 6,
            columns: 6,
        },
    );
    assert_refused(
        &stripe,
        2,
        &[0, usize::MAX],
        &EcError::BadIndex {
            index: usize::MAX,
            columns: 6,
        },
    );
    assert_refused(&stripe, 0, &[], &EcError::BadParity { parity: 0 });
    assert_refused(&stripe, 3, &[0], &EcError::BadParity { parity: 3 });
    assert_refused(&stripe[..2], 2, &[0], &EcError::NoDataColumns);
    assert_refused(&[], 1, &[], &EcError::NoDataColumns);

    let single = encoded_stripe(&mut random, 4, 1, 40);
    assert_refused(
        &single,
        1,
        &[0, 1],
        &EcError::TooManyErasures {
            erased: 2,
            parity: 1,
        },
    );

    let mut uneven = stripe.clone();
    uneven[3].push(0);
    assert_refused(
        &uneven,
        2,
        &[0],
        &EcError::LengthMismatch {
            column: 3,
            expected: 40,
            actual: 41,
        },
    );

    let too_wide = vec![vec![0u8; 8]; MAX_DATA_COLUMNS + 1 + 2];
    assert_refused(
        &too_wide,
        2,
        &[0],
        &EcError::TooManyColumns {
            data_columns: MAX_DATA_COLUMNS + 1,
            max: MAX_DATA_COLUMNS,
        },
    );
}

#[test]
fn known_answer_vector() {
    // Three data columns of four bytes, chosen to hit the reduction:
    // every byte of column 1 has its top bit set in byte 1.
    let data: [[u8; 4]; 3] = [
        [0x01, 0x80, 0xff, 0x00],
        [0x02, 0x80, 0x0f, 0x53],
        [0x04, 0x80, 0xf0, 0xca],
    ];
    // P is the XOR of each byte position.
    let expected_p = [0x07, 0x80, 0x00, 0x99];
    // Q[j] = D0[j] ⊕ 2·D1[j] ⊕ 4·D2[j], worked by hand:
    //  byte 0: 0x01 ⊕ 2·0x02 ⊕ 4·0x04 = 0x01 ⊕ 0x04 ⊕ 0x10 = 0x15
    //  byte 1: 2·0x80 = 0x100 → drop bit 8, XOR 0x1d = 0x1d; 4·0x80 = 2·0x1d
    //          = 0x3a; 0x80 ⊕ 0x1d ⊕ 0x3a = 0xa7
    //  byte 2: 2·0x0f = 0x1e; 2·0xf0 = 0x1e0 → 0xe0 ⊕ 0x1d = 0xfd,
    //          2·0xfd = 0x1fa → 0xfa ⊕ 0x1d = 0xe7; 0xff ⊕ 0x1e ⊕ 0xe7 = 0x06
    //  byte 3: 2·0x53 = 0xa6; 2·0xca = 0x194 → 0x94 ⊕ 0x1d = 0x89,
    //          2·0x89 = 0x112 → 0x12 ⊕ 0x1d = 0x0f; 0x00 ⊕ 0xa6 ⊕ 0x0f = 0xa9
    let expected_q = [0x15, 0xa7, 0x06, 0xa9];

    let slices: Vec<&[u8]> = data.iter().map(|column| &column[..]).collect();
    let mut encoders = vec![("scalar", terrace_ec::scalar::encode_pq as common::EncodePq)];
    encoders.extend(
        common::fast_implementations()
            .into_iter()
            .map(|implementation| (implementation.name, implementation.encode_pq)),
    );
    for (name, encode_pq) in encoders {
        let mut p = [0; 4];
        let mut q = [0; 4];
        encode_pq(&slices, &mut p, &mut q);
        assert_eq!(p, expected_p, "{name}: P");
        assert_eq!(q, expected_q, "{name}: Q");
    }

    // And back: lose columns 0 and 2, solve from P and Q.
    let stripe: Vec<Vec<u8>> = data
        .iter()
        .map(|column| column.to_vec())
        .chain([expected_p.to_vec(), expected_q.to_vec()])
        .collect();
    let mut random = Random::new(14);
    for implementation in all_implementations() {
        let rebuilt =
            wipe_and_rebuild(implementation.reconstruct, &stripe, 2, &[0, 2], &mut random).unwrap();
        assert!(rebuilt == stripe, "{}", implementation.name);
    }
}

/// A random stripe shape and an erasure pattern it can survive.
fn stripe_and_erasures() -> impl Strategy<Value = (usize, usize, usize, u64, Vec<usize>)> {
    (1..=24usize, 1..=2usize).prop_flat_map(|(data_columns, parity)| {
        let columns: Vec<usize> = (0..data_columns + parity).collect();
        (
            Just(data_columns),
            Just(parity),
            0..=700usize,
            any::<u64>(),
            proptest::sample::subsequence(columns, 0..=parity).prop_shuffle(),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_stripes_are_restored(
        (data_columns, parity, length, seed, erased) in stripe_and_erasures()
    ) {
        let mut random = Random::new(seed);
        let stripe = encoded_stripe(&mut random, data_columns, parity, length);
        for reconstruct in [terrace_ec::reconstruct as common::Reconstruct, terrace_ec::scalar::reconstruct] {
            let rebuilt = wipe_and_rebuild(reconstruct, &stripe, parity, &erased, &mut random);
            prop_assert_eq!(rebuilt.as_ref(), Ok(&stripe));
        }
        // The fast encoder agrees with the stripe the oracle built.
        let data = as_slices(&stripe[..data_columns]);
        let mut p = vec![0; length];
        let mut q = vec![0; length];
        terrace_ec::encode_pq(&data, &mut p, &mut q);
        prop_assert_eq!(&p, &stripe[data_columns]);
        if parity == 2 {
            prop_assert_eq!(&q, &stripe[data_columns + 1]);
        }
    }
}
