//! Why a layout could not serve a row, or part of one: the reasons a
//! [`RowLayout`](super::RowLayout) gives, typed, worded once here. The
//! space turns one into the user's error ([`RowIo::unavailable`]).
//!
//! May depend on: `row` (its [`RowError`]) and `terrace_ec`.
//!
//! [`RowIo::unavailable`]: crate::row::RowIo::unavailable

use std::fmt;

use terrace_ec::EcError;

use crate::row::RowError;

#[derive(Debug, thiserror::Error)]
pub(crate) enum RowFailure {
    /// A simple layout's slot failed: nothing else holds its data.
    #[error("simple layout has no redundancy: {0}")]
    NoRedundancy(#[source] RowError),
    /// A simple layout's slot is asked for from the others.
    #[error("a simple layout keeps one copy; its data is lost")]
    OneCopy,
    /// No copy of a mirror column but the one wanted can be read.
    #[error("no other copy of this column is readable")]
    NoOtherCopy,
    /// Every copy of a mirror column failed or was offline; `last`, the
    /// last copy's error (none if no copy was online).
    #[error("every copy is lost ({})", last_or_offline(.last))]
    EveryCopyLost { last: Option<RowError> },
    #[error("no copy of this column could be written")]
    NoCopyWritten,
    #[error("no copy of this column could be zeroed")]
    NoCopyZeroed,
    /// More columns of a parity row are lost than its parity rebuilds.
    #[error("{lost} columns of this row are lost; parity rebuilds at most {redundancy}")]
    TooManyLost { lost: usize, redundancy: usize },
    /// Each round of a parity rebuild lost one more disk, past every round.
    #[error("disks kept failing while rebuilding")]
    KeptFailingRebuilding,
    /// Each round of a parity write lost one more disk, past every round.
    #[error("disks kept failing while writing")]
    KeptFailingWriting,
    /// A column needed to rebuild a slot failed as it was read.
    #[error("a surviving column failed while rebuilding")]
    SurvivorFailed,
    /// A slot asked for is not one of the row's.
    #[error("slot {slot} is not in this row")]
    NotInRow { slot: u32 },
    #[error("{0}")]
    Reconstruct(#[from] EcError),
}

/// The last copy's error, or that none was online.
fn last_or_offline(last: &Option<RowError>) -> &dyn fmt::Display {
    match last {
        Some(error) => error,
        None => &"no copy is online",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The words users have seen for each reason, kept as they were.
    #[test]
    fn reasons_read_as_before() {
        let no_copy = || RowError::NoValidCopy { slot: 2, row: 7 };
        let cases = [
            (
                RowFailure::NoRedundancy(no_copy()),
                "simple layout has no redundancy: slot 2 holds no valid copy of row 7",
            ),
            (
                RowFailure::EveryCopyLost { last: None },
                "every copy is lost (no copy is online)",
            ),
            (
                RowFailure::EveryCopyLost {
                    last: Some(no_copy()),
                },
                "every copy is lost (slot 2 holds no valid copy of row 7)",
            ),
            (
                RowFailure::TooManyLost {
                    lost: 3,
                    redundancy: 2,
                },
                "3 columns of this row are lost; parity rebuilds at most 2",
            ),
            (
                RowFailure::OneCopy,
                "a simple layout keeps one copy; its data is lost",
            ),
            (
                RowFailure::NotInRow { slot: 4 },
                "slot 4 is not in this row",
            ),
        ];
        for (reason, text) in cases {
            assert_eq!(reason.to_string(), text);
        }
    }
}
