//! Layout math: where every byte of a space lives.
//!
//! Pure functions only: no I/O, no allocation beyond what a caller collects.
//!
//! # Theory
//!
//! A space is a list of *extents*. An extent is one slab per *slot*; the
//! slots of an extent sit on distinct disks. Inside an extent the space's
//! bytes are laid out in *rows*: a row is `interleave` bytes on every column,
//! and row `r` of every slab starts at byte `r × interleave` of that slab.
//!
//! ```text
//! simple, 3 columns            mirror, 2 columns × 2 copies
//! slot:   0    1    2          slot:   0    1    2    3
//!        col0 col1 col2               c0/a c0/b c1/a c1/b
//! row 0: D0   D1   D2          row 0: D0   D0   D1   D1
//! row 1: D3   D4   D5          row 1: D2   D2   D3   D3
//!
//! dual parity, 5 columns (3 data): P and Q rotate left one column per row
//! slot:   0    1    2    3    4
//! row 0: Q    D0   D1   D2   P       P at n-1-(r mod n), Q right after it,
//! row 1: D3   D4   D5   P    Q       data columns follow Q, wrapping around
//! row 2: D7   D8   P    Q    D6
//! ```
//!
//! Rotating parity spreads the parity writes of small updates over every disk
//! instead of making one disk the bottleneck (the RAID-4 problem).
//!
//! `columns` counts the disks one row spans, parity included and mirror
//! copies not (the Storage Spaces meaning), so a 2-way mirror with 4 columns
//! uses 8 slabs per extent and a dual-parity space with 8 columns has 6 data
//! columns.
//!
//! # Layouts as data, not a trait
//!
//! The set of layouts is closed and small, so [`Layout`] is an enum and every
//! rule (minimum disks, tolerated failures, where a copy or parity lives) is a
//! `match` the compiler checks for exhaustiveness. Health is derived from the
//! one declaration of tolerance in [`Geometry::remaining_tolerance`].

use std::fmt;

/// Smallest interleave: one 4 KiB block, the device I/O granularity.
pub const INTERLEAVE_MIN_BYTES: u64 = 4096;
/// Largest interleave: 16 MiB; larger gains nothing for streaming and makes
/// every partial-stripe parity update read and write more.
pub const INTERLEAVE_MAX_BYTES: u64 = 16 << 20;
/// Default interleave, as Storage Spaces: 256 KiB.
pub const INTERLEAVE_DEFAULT_BYTES: u64 = 256 << 10;
/// Columns chosen automatically stop at 8: wider rows make partial parity
/// updates and rebuilds touch more disks for little streaming gain.
pub const COLUMNS_AUTOMATIC_MAX: u32 = 8;
/// Columns given explicitly stop at 64: an extent needs that many distinct
/// disks, and the parity code supports up to 253 data columns.
pub const COLUMNS_MAX: u32 = 64;
/// Block granularity of every space: offsets and lengths are multiples of it.
pub const BLOCK_BYTES: u64 = 4096;

/// A space's resiliency.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Striping, no redundancy.
    Simple,
    /// Every column kept `copies` times (2 or 3).
    Mirror { copies: u32 },
    /// `redundancy` parity columns per row: 1 (P) or 2 (P and Q).
    Parity { redundancy: u32 },
}

impl Layout {
    /// Disks needed for the smallest valid space of this layout.
    pub fn min_disks(self) -> u32 {
        match self {
            Layout::Simple => 1,
            Layout::Mirror { copies } => copies,
            Layout::Parity { redundancy } => redundancy + 2,
        }
    }

    /// Disk failures every extent survives.
    pub fn failures_tolerated(self) -> u32 {
        match self {
            Layout::Simple => 0,
            Layout::Mirror { copies } => copies - 1,
            Layout::Parity { redundancy } => redundancy,
        }
    }

    /// Columns the smallest valid space spans.
    pub fn min_columns(self) -> u32 {
        match self {
            Layout::Simple | Layout::Mirror { .. } => 1,
            Layout::Parity { redundancy } => redundancy + 2,
        }
    }

    /// Slabs one column occupies in an extent (mirror copies).
    pub fn copies(self) -> u32 {
        match self {
            Layout::Mirror { copies } => copies,
            Layout::Simple | Layout::Parity { .. } => 1,
        }
    }

    pub fn parity_columns(self) -> u32 {
        match self {
            Layout::Parity { redundancy } => redundancy,
            Layout::Simple | Layout::Mirror { .. } => 0,
        }
    }

    /// Whether a row's redundancy is computed from all its columns
    /// (parity). A write of part of such a row rewrites redundancy that
    /// covers data it did not write, so a power cut mid-write can tear the
    /// row (the write hole) unless a log holds the write first; and its
    /// columns form one redundancy group, so no two may share a fault
    /// domain. Otherwise redundancy is per column (copies).
    pub fn row_wide_redundancy(self) -> bool {
        self.parity_columns() > 0
    }

    /// The fewest slots of an extent that must lie in distinct fault
    /// domains: a row's columns where redundancy is row-wide, else one
    /// column's copies.
    pub fn fault_domain_group(self) -> u32 {
        if self.row_wide_redundancy() {
            self.min_columns()
        } else {
            self.copies()
        }
    }

    fn validate(self) -> Result<(), LayoutError> {
        match self {
            Layout::Simple => Ok(()),
            Layout::Mirror { copies: 2 | 3 } => Ok(()),
            Layout::Parity { redundancy: 1 | 2 } => Ok(()),
            Layout::Mirror { copies } => Err(LayoutError::BadCopies { copies }),
            Layout::Parity { redundancy } => Err(LayoutError::BadRedundancy { redundancy }),
        }
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Layout::Simple => f.write_str("simple"),
            Layout::Mirror { copies } => write!(f, "{copies}-way mirror"),
            Layout::Parity { redundancy: 1 } => f.write_str("single parity"),
            Layout::Parity { .. } => f.write_str("dual parity"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LayoutError {
    #[error("a mirror keeps 2 or 3 copies, not {copies}")]
    BadCopies { copies: u32 },
    #[error("parity redundancy is 1 (single) or 2 (dual), not {redundancy}")]
    BadRedundancy { redundancy: u32 },
    #[error("{layout} needs at least {minimum} disks; {available} are usable")]
    TooFewDisks {
        layout: Layout,
        minimum: u32,
        available: u32,
    },
    #[error("{layout} needs between {minimum} and {maximum} columns, not {columns}")]
    BadColumns {
        layout: Layout,
        columns: u32,
        minimum: u32,
        maximum: u32,
    },
    #[error("{layout} with {columns} columns needs {needed} disks; only {available} are usable")]
    ColumnsExceedDisks {
        layout: Layout,
        columns: u32,
        needed: u32,
        available: u32,
    },
    #[error("interleave must be a power of two from 4K to 16M, not {interleave_bytes} bytes")]
    BadInterleave { interleave_bytes: u64 },
    #[error("slab size {slab_bytes} must be a power of two and at least the interleave {interleave_bytes}")]
    BadSlab {
        slab_bytes: u64,
        interleave_bytes: u64,
    },
}

/// The full description of how a space maps onto its extents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    layout: Layout,
    columns: u32,
    interleave_bytes: u64,
    slab_bytes: u64,
}

/// Where one byte of a space lives, before choosing a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Location {
    pub extent: u64,
    /// Row within the extent.
    pub row: u64,
    /// Data column within the row (0-based, parity excluded).
    pub data_column: u32,
    /// Byte within the column's interleave.
    pub column_offset: u64,
}

/// A piece of a request that stays inside one row of one extent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpan {
    pub extent: u64,
    pub row: u64,
    /// First byte within the row's data (0 ..= row data bytes).
    pub row_offset: u64,
    pub length: u64,
    /// Where this piece starts within the caller's request buffer.
    pub request_offset: u64,
}

/// A piece of a row span that stays inside one data column.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnPiece {
    pub data_column: u32,
    pub column_offset: u64,
    pub length: u64,
    pub request_offset: u64,
}

impl Geometry {
    pub fn new(
        layout: Layout,
        columns: u32,
        interleave_bytes: u64,
        slab_bytes: u64,
    ) -> Result<Geometry, LayoutError> {
        layout.validate()?;
        if !(layout.min_columns()..=COLUMNS_MAX).contains(&columns) {
            return Err(LayoutError::BadColumns {
                layout,
                columns,
                minimum: layout.min_columns(),
                maximum: COLUMNS_MAX,
            });
        }
        if !interleave_bytes.is_power_of_two()
            || !(INTERLEAVE_MIN_BYTES..=INTERLEAVE_MAX_BYTES).contains(&interleave_bytes)
        {
            return Err(LayoutError::BadInterleave { interleave_bytes });
        }
        if !slab_bytes.is_power_of_two() || slab_bytes < interleave_bytes {
            return Err(LayoutError::BadSlab {
                slab_bytes,
                interleave_bytes,
            });
        }
        Ok(Geometry {
            layout,
            columns,
            interleave_bytes,
            slab_bytes,
        })
    }

    pub fn layout(&self) -> Layout {
        self.layout
    }
    pub fn columns(&self) -> u32 {
        self.columns
    }
    pub fn interleave_bytes(&self) -> u64 {
        self.interleave_bytes
    }
    pub fn slab_bytes(&self) -> u64 {
        self.slab_bytes
    }

    /// Columns that carry data (parity excluded).
    pub fn data_columns(&self) -> u32 {
        self.columns - self.layout.parity_columns()
    }

    /// Slabs, hence distinct disks, in one extent.
    pub fn slots_per_extent(&self) -> u32 {
        self.columns * self.layout.copies()
    }

    pub fn row_data_bytes(&self) -> u64 {
        u64::from(self.data_columns()) * self.interleave_bytes
    }

    /// The whole of `row` of `extent`, as one span.
    pub fn whole_row(&self, extent: u64, row: u64) -> RowSpan {
        RowSpan {
            extent,
            row,
            row_offset: 0,
            length: self.row_data_bytes(),
            request_offset: 0,
        }
    }

    pub fn rows_per_extent(&self) -> u64 {
        self.slab_bytes / self.interleave_bytes
    }

    /// Space bytes one extent holds.
    pub fn extent_data_bytes(&self) -> u64 {
        u64::from(self.data_columns()) * self.slab_bytes
    }

    /// Extents needed to hold `size_bytes` of space.
    pub fn extents_for(&self, size_bytes: u64) -> u64 {
        size_bytes.div_ceil(self.extent_data_bytes())
    }

    /// Raw bytes consumed per byte of space, as a ratio (raw, usable).
    pub fn raw_per_usable(&self) -> (u64, u64) {
        (
            u64::from(self.slots_per_extent()),
            u64::from(self.data_columns()),
        )
    }

    pub fn locate(&self, offset: u64) -> Location {
        let extent = offset / self.extent_data_bytes();
        let within_extent = offset % self.extent_data_bytes();
        let row = within_extent / self.row_data_bytes();
        let within_row = within_extent % self.row_data_bytes();
        Location {
            extent,
            row,
            data_column: (within_row / self.interleave_bytes) as u32,
            column_offset: within_row % self.interleave_bytes,
        }
    }

    /// Split `[offset, offset + length)` at row boundaries. This is the one
    /// place requests are cut; everything below sees a single row.
    pub fn split_rows(&self, offset: u64, length: u64) -> impl Iterator<Item = RowSpan> + '_ {
        let row_bytes = self.row_data_bytes();
        let mut position = offset;
        let end = offset + length;
        std::iter::from_fn(move || {
            if position >= end {
                return None;
            }
            let location = self.locate(position);
            let row_offset = position % row_bytes;
            let span_length = (row_bytes - row_offset).min(end - position);
            let span = RowSpan {
                extent: location.extent,
                row: location.row,
                row_offset,
                length: span_length,
                request_offset: position - offset,
            };
            position += span_length;
            Some(span)
        })
    }

    /// Split a row span at column boundaries.
    pub fn split_columns(&self, span: RowSpan) -> impl Iterator<Item = ColumnPiece> + '_ {
        let interleave = self.interleave_bytes;
        let mut position = span.row_offset;
        let end = span.row_offset + span.length;
        std::iter::from_fn(move || {
            if position >= end {
                return None;
            }
            let column_offset = position % interleave;
            let piece_length = (interleave - column_offset).min(end - position);
            let piece = ColumnPiece {
                data_column: (position / interleave) as u32,
                column_offset,
                length: piece_length,
                request_offset: span.request_offset + (position - span.row_offset),
            };
            position += piece_length;
            Some(piece)
        })
    }

    /// Physical column (0..columns) of data column `data_column` in `row`.
    pub fn physical_column(&self, row: u64, data_column: u32) -> u32 {
        debug_assert!(data_column < self.data_columns());
        match self.layout {
            Layout::Simple | Layout::Mirror { .. } => data_column,
            Layout::Parity { redundancy } => {
                (self.parity_column(row, 0) + redundancy + data_column) % self.columns
            }
        }
    }

    /// Physical column of parity `index` (0 = P, 1 = Q) in `row`.
    pub fn parity_column(&self, row: u64, index: u32) -> u32 {
        let redundancy = self.layout.parity_columns();
        assert!(index < redundancy, "parity index {index} of {redundancy}");
        let columns = u64::from(self.columns);
        let p = (columns - 1 - row % columns) as u32;
        (p + index) % self.columns
    }

    /// Slot (slab within the extent) holding `copy` of a physical column.
    pub fn slot(&self, physical_column: u32, copy: u32) -> u32 {
        debug_assert!(physical_column < self.columns && copy < self.layout.copies());
        physical_column * self.layout.copies() + copy
    }

    /// Byte offset within a slab of (row, column offset).
    pub fn slab_offset(&self, row: u64, column_offset: u64) -> u64 {
        row * self.interleave_bytes + column_offset
    }

    /// Inverse mapping: the space offset stored at `offset_in_slab` of
    /// `slot` in `extent`, or `None` for parity bytes.
    pub fn space_offset(&self, extent: u64, slot: u32, offset_in_slab: u64) -> Option<u64> {
        assert!(slot < self.slots_per_extent() && offset_in_slab < self.slab_bytes);
        let physical_column = slot / self.layout.copies();
        let row = offset_in_slab / self.interleave_bytes;
        let column_offset = offset_in_slab % self.interleave_bytes;
        let data_column = match self.layout {
            Layout::Simple | Layout::Mirror { .. } => physical_column,
            Layout::Parity { redundancy } => {
                let p = self.parity_column(row, 0);
                let distance = (physical_column + self.columns - p) % self.columns;
                if distance < redundancy {
                    return None;
                }
                distance - redundancy
            }
        };
        Some(
            extent * self.extent_data_bytes()
                + row * self.row_data_bytes()
                + u64::from(data_column) * self.interleave_bytes
                + column_offset,
        )
    }

    /// How many more slot failures an extent survives given the slots
    /// already lost, or `None` if its data is already lost.
    pub fn remaining_tolerance(&self, lost: impl Fn(u32) -> bool) -> Option<u32> {
        match self.layout {
            Layout::Simple => (0..self.columns).all(|slot| !lost(slot)).then_some(0),
            Layout::Mirror { copies } => (0..self.columns)
                .map(|column| {
                    let alive = (0..copies).filter(|&c| !lost(self.slot(column, c))).count();
                    (alive as u32).checked_sub(1)
                })
                .try_fold(copies - 1, |least, left| left.map(|l| least.min(l))),
            Layout::Parity { redundancy } => {
                let lost_count = (0..self.columns).filter(|&slot| lost(slot)).count() as u32;
                redundancy.checked_sub(lost_count)
            }
        }
    }

    /// Groups of slots that must sit in distinct fault domains: the copies
    /// of one mirror column, or every column of a parity extent. A simple
    /// layout has no redundancy to protect, so each slot is its own group.
    pub fn redundancy_groups(&self) -> Vec<Vec<u32>> {
        match self.layout {
            Layout::Simple => (0..self.columns).map(|slot| vec![slot]).collect(),
            Layout::Mirror { copies } => (0..self.columns)
                .map(|column| (0..copies).map(|c| self.slot(column, c)).collect())
                .collect(),
            Layout::Parity { .. } => vec![(0..self.columns).collect()],
        }
    }
}

/// The column count picked for a new space, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ColumnChoice {
    pub columns: u32,
    pub reason: ColumnsReason,
}

/// Why a new space got its column count. The words for people are the
/// engine's (it stores them with the space); this is the decision alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColumnsReason {
    /// The count asked for.
    Requested,
    /// The automatic maximum, [`COLUMNS_AUTOMATIC_MAX`], although
    /// `usable_disks` would allow `fit`.
    AutomaticMaximum { usable_disks: u32, fit: u32 },
    /// As wide as `width` of `usable_disks` allow, one kept free so that a
    /// failed disk is rebuilt into free space.
    KeepingOneFree { width: u32, usable_disks: u32 },
    /// As wide as `usable_disks` allow: too few to keep one free for
    /// rebuilds.
    TooFewToKeepOneFree { usable_disks: u32 },
    /// As wide as `usable_disks` allow (no redundancy to rebuild).
    AsWideAsDisksAllow { usable_disks: u32 },
}

/// Choose (or check) the column count of a new space given how many disks
/// (or distinct fault domains) can hold its slabs.
pub fn choose_columns(
    layout: Layout,
    requested: Option<u32>,
    usable_disks: u32,
) -> Result<ColumnChoice, LayoutError> {
    layout.validate()?;
    let copies = layout.copies();
    if usable_disks < layout.min_disks() {
        return Err(LayoutError::TooFewDisks {
            layout,
            minimum: layout.min_disks(),
            available: usable_disks,
        });
    }
    if let Some(columns) = requested {
        if !(layout.min_columns()..=COLUMNS_MAX).contains(&columns) {
            return Err(LayoutError::BadColumns {
                layout,
                columns,
                minimum: layout.min_columns(),
                maximum: COLUMNS_MAX,
            });
        }
        if columns * copies > usable_disks {
            return Err(LayoutError::ColumnsExceedDisks {
                layout,
                columns,
                needed: columns * copies,
                available: usable_disks,
            });
        }
        return Ok(ColumnChoice {
            columns,
            reason: ColumnsReason::Requested,
        });
    }
    // A redundant space leaves one disk's width free where it can, so that
    // a failed disk is rebuilt at once into free space on the others, in
    // parallel, instead of waiting for a spare or a new disk.
    let redundant = layout.failures_tolerated() > 0;
    let keep_free = redundant && (usable_disks - 1) / copies >= layout.min_columns();
    let width = if keep_free {
        usable_disks - 1
    } else {
        usable_disks
    };
    let fit = width / copies;
    let columns = fit.min(COLUMNS_AUTOMATIC_MAX);
    let reason = if fit > COLUMNS_AUTOMATIC_MAX {
        ColumnsReason::AutomaticMaximum { usable_disks, fit }
    } else if keep_free {
        ColumnsReason::KeepingOneFree {
            width,
            usable_disks,
        }
    } else if redundant {
        ColumnsReason::TooFewToKeepOneFree { usable_disks }
    } else {
        ColumnsReason::AsWideAsDisksAllow { usable_disks }
    };
    Ok(ColumnChoice { columns, reason })
}

#[cfg(test)]
mod tests;
