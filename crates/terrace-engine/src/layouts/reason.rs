//! The words for a new space's column choice, stored with the space (the
//! metadata keeps them as text: `columns_reason`) and shown by `space
//! list`. `terrace_layout` decides; this says why, for people.
//!
//! May depend on: `terrace_layout`.

use terrace_layout::{ColumnChoice, ColumnsReason, Layout};

/// "1 column", "3 columns": a count with its noun as a sentence says it.
/// Column choices are explained with it, and so is everything else the
/// system counts for people (disks, failures, log disks).
pub fn count(n: impl Into<u64>, noun: &str) -> String {
    match n.into() {
        1 => format!("1 {noun}"),
        n => format!("{n} {noun}s"),
    }
}

/// Why `choice` was made for a space of `layout`, as a sentence.
pub(crate) fn columns_reason(layout: Layout, choice: &ColumnChoice) -> String {
    let chosen = count(choice.columns, "column");
    let copies = layout.copies();
    let copies_note = if copies > 1 {
        format!(" ({copies} copies each)")
    } else {
        String::new()
    };
    match choice.reason {
        ColumnsReason::Requested => format!("{chosen}, as requested"),
        ColumnsReason::AutomaticMaximum { usable_disks, fit } => format!(
            "{chosen}{copies_note}: the automatic maximum; {usable_disks} usable disks would allow {fit}, but wider rows make small parity updates and rebuilds touch more disks"
        ),
        ColumnsReason::KeepingOneFree {
            width,
            usable_disks,
        } => format!(
            "{chosen}{copies_note}: as wide as {width} of {usable_disks} usable disks allow, keeping one free so that a failed disk is rebuilt into free space without a spare"
        ),
        ColumnsReason::TooFewToKeepOneFree { usable_disks } => format!(
            "{chosen}{copies_note}: as wide as {usable_disks} usable disks allow (too few to keep one free for rebuilds: a failed disk waits for a spare or a new disk)"
        ),
        ColumnsReason::AsWideAsDisksAllow { usable_disks } => {
            format!("{chosen}{copies_note}: as wide as {usable_disks} usable disks allow")
        }
    }
}

#[cfg(test)]
mod tests {
    use terrace_layout::choose_columns;

    use super::*;

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(count(1u32, "column"), "1 column");
        assert_eq!(count(2u32, "failure"), "2 failures");
        assert_eq!(count(0u64, "disk"), "0 disks");
    }

    /// The sentences stored with spaces stay word for word what they were.
    #[test]
    fn column_choices_read_as_before() {
        let dual = Layout::Parity { redundancy: 2 };
        let mirror = Layout::Mirror { copies: 2 };
        for (layout, requested, usable, expected) in [
            (dual, Some(4), 6, "4 columns, as requested"),
            (Layout::Simple, Some(1), 6, "1 column, as requested"),
            (
                dual,
                None,
                11,
                "8 columns: the automatic maximum; 11 usable disks would allow 10, but wider rows make small parity updates and rebuilds touch more disks",
            ),
            (
                mirror,
                None,
                12,
                "5 columns (2 copies each): as wide as 11 of 12 usable disks allow, keeping one free so that a failed disk is rebuilt into free space without a spare",
            ),
            (
                dual,
                None,
                4,
                "4 columns: as wide as 4 usable disks allow (too few to keep one free for rebuilds: a failed disk waits for a spare or a new disk)",
            ),
            (
                Layout::Simple,
                None,
                6,
                "6 columns: as wide as 6 usable disks allow",
            ),
        ] {
            let choice = choose_columns(layout, requested, usable).expect("a choice");
            assert_eq!(columns_reason(layout, &choice), expected);
        }
    }
}
