//! Argument checks shared by every implementation, and the classification of
//! an erasure list into the cases the theory block in the crate root solves.

use crate::{EcError, MAX_DATA_COLUMNS, MAX_PARITY};

/// Panics unless `data` is a supported number of columns, each `length` bytes.
pub(crate) fn data_columns(data: &[&[u8]], length: usize) {
    assert!(
        (1..=MAX_DATA_COLUMNS).contains(&data.len()),
        "a stripe has 1..={MAX_DATA_COLUMNS} data columns, got {}",
        data.len()
    );
    for (column, bytes) in data.iter().enumerate() {
        assert_eq!(
            bytes.len(),
            length,
            "data column {column} is {} bytes but the parity is {length}",
            bytes.len()
        );
    }
}

/// Panics unless `data` (data columns with holes where erased) has a
/// supported number of columns and every present one is `length` bytes.
pub(crate) fn present_columns(data: &[Option<&[u8]>], length: usize) {
    assert!(
        (1..=MAX_DATA_COLUMNS).contains(&data.len()),
        "a stripe has 1..={MAX_DATA_COLUMNS} data columns, got {}",
        data.len()
    );
    for (column, bytes) in data.iter().enumerate() {
        if let Some(bytes) = bytes {
            assert_eq!(
                bytes.len(),
                length,
                "data column {column} is {} bytes, expected {length}",
                bytes.len()
            );
        }
    }
}

/// Panics unless `sources` is a list of XOR sources the kernels accept, each
/// `length` bytes: the data columns, or when a data column is rebuilt from P,
/// the surviving data columns and P, so one more than the data limit.
pub(crate) fn sources(sources: &[&[u8]], length: usize) {
    assert!(
        (1..=MAX_DATA_COLUMNS + 1).contains(&sources.len()),
        "XOR of {} sources requested",
        sources.len()
    );
    for (index, source) in sources.iter().enumerate() {
        assert_eq!(
            source.len(),
            length,
            "source {index} is {} bytes, the output {length}",
            source.len()
        );
    }
}

/// Panics unless the two buffers have the same length.
pub(crate) fn same_length(destination: &[u8], source: &[u8]) {
    assert_eq!(
        destination.len(),
        source.len(),
        "destination is {} bytes, source is {}",
        destination.len(),
        source.len()
    );
}

/// Which columns of a stripe are lost, by case. Indices are data-column
/// indices (`0..k`); the parity columns are named by the variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Pattern {
    /// Nothing erased: nothing to do.
    Nothing,
    /// Only P lost: recompute it.
    P,
    /// Only Q lost: recompute it.
    Q,
    /// Both parities lost: re-encode.
    PQ,
    /// One data column lost, P intact (Q intact or absent).
    Data { column: usize },
    /// One data column and P lost: solve from Q.
    DataAndP { column: usize },
    /// One data column and Q lost: solve from P, then recompute Q.
    DataAndQ { column: usize },
    /// Two data columns lost, `low < high`: solve the 2 × 2 system.
    TwoData { low: usize, high: usize },
}

/// A validated reconstruction request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// k, the number of data columns.
    pub data_columns: usize,
    pub pattern: Pattern,
}

/// Validates the arguments of `reconstruct` and classifies the erasures.
pub(crate) fn reconstruct_request(
    columns: &[&mut [u8]],
    parity: usize,
    erased: &[usize],
) -> Result<Request, EcError> {
    if !(1..=MAX_PARITY).contains(&parity) {
        return Err(EcError::BadParity { parity });
    }
    let data_columns = columns.len().saturating_sub(parity);
    if data_columns == 0 {
        return Err(EcError::NoDataColumns);
    }
    if data_columns > MAX_DATA_COLUMNS {
        return Err(EcError::TooManyColumns {
            data_columns,
            max: MAX_DATA_COLUMNS,
        });
    }
    if erased.len() > parity {
        return Err(EcError::TooManyErasures {
            erased: erased.len(),
            parity,
        });
    }
    for (position, &index) in erased.iter().enumerate() {
        if index >= columns.len() {
            return Err(EcError::BadIndex {
                index,
                columns: columns.len(),
            });
        }
        if erased[..position].contains(&index) {
            return Err(EcError::DuplicateIndex { index });
        }
    }
    let expected = columns[0].len();
    if let Some((column, bytes)) = columns
        .iter()
        .enumerate()
        .find(|(_, bytes)| bytes.len() != expected)
    {
        return Err(EcError::LengthMismatch {
            column,
            expected,
            actual: bytes.len(),
        });
    }
    Ok(Request {
        data_columns,
        pattern: classify(data_columns, erased),
    })
}

/// Names the case. `erased` is already known to be in range, distinct and at
/// most two long.
fn classify(data_columns: usize, erased: &[usize]) -> Pattern {
    let p = data_columns;
    let q = data_columns + 1;
    let mut sorted = [usize::MAX; MAX_PARITY];
    sorted[..erased.len()].copy_from_slice(erased);
    sorted.sort_unstable();
    match &sorted[..erased.len()] {
        [] => Pattern::Nothing,
        [only] if *only == p => Pattern::P,
        [only] if *only == q => Pattern::Q,
        [column] => Pattern::Data { column: *column },
        [first, second] if *first == p && *second == q => Pattern::PQ,
        [column, second] if *second == p => Pattern::DataAndP { column: *column },
        [column, second] if *second == q => Pattern::DataAndQ { column: *column },
        [low, high] => Pattern::TwoData {
            low: *low,
            high: *high,
        },
        _ => unreachable!("more erasures than MAX_PARITY were rejected above"),
    }
}
