//! What a verify found, and where: the rows whose redundancy disagrees,
//! with the slots, disks and disk offsets involved.
//!
//! Which slot of a disagreeing row is wrong can only sometimes be told:
//!
//! * Mirror copies that differ: any of them may be the damaged one; every
//!   copy of the column is named.
//! * Single parity: P disagrees with the data, and any column of the row
//!   may be the damaged one; every slot of the row is named, P first.
//! * Dual parity: one damaged column is found. Only P or only Q wrong:
//!   that parity column. Both wrong: the data column which, rebuilt from
//!   P and the others, makes Q agree too (a single damaged data column
//!   always does; two damaged columns almost never do, and then every
//!   slot of the row is named).
//!
//! What a slot holds in its row (its [`Role`]) is its layout's to say
//! (`RowLayout::role`); the layouts name the places of what they find.
//!
//! May depend on: `row` and what it depends on, `terrace_ec`.

use std::fmt;

use terrace_meta::DiskIndex;

use crate::row::{RowHost, RowIo};

/// Most findings a verify keeps with their places; past this it only
/// counts rows (the report's `mismatched_rows`). A hundred rows are
/// enough to see a pattern (one disk, one extent, everywhere) and keep
/// the answer to the command line a few pages at most.
pub const FINDINGS_MAX: usize = 100;

/// One row whose redundancy disagrees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// The row's data in the space: `[offset, offset + length)`.
    pub offset: u64,
    pub length: u64,
    pub extent: u64,
    /// The row within its extent.
    pub row: u64,
    pub problems: Vec<Problem>,
}

/// One disagreement within a row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub kind: ProblemKind,
    /// The slots it involves; the damaged one alone where it can be told
    /// (see the module's comment).
    pub places: Vec<Place>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProblemKind {
    /// The copies of a mirror column differ.
    Copies { column: u32 },
    /// Parity disagrees with the data: `p`/`q`, which parity columns do;
    /// `damaged`, the one slot found wrong (dual parity only).
    Parity { p: bool, q: bool, damaged: bool },
    /// A slot being moved reads differently at its new place.
    Moving { slot: u32 },
    /// Blocks of the slot failed their sums, and were rebuilt from the
    /// other copies or from parity (the place named is the damaged one).
    Checksum { blocks: u64 },
    /// Blocks of the row failed their sums and nothing could rebuild
    /// them: reads of them fail.
    Unrecoverable { blocks: u64 },
    /// The slot's row could not be read (a read error on a disk still in
    /// service): rebuilt from redundancy and rewritten, unless read-only.
    Unreadable,
}

impl fmt::Display for ProblemKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ProblemKind::Copies { column } => write!(f, "the copies of column {column} differ"),
            ProblemKind::Parity { p, q, damaged } => {
                let which = match (p, q) {
                    (true, true) => "P and Q disagree",
                    (false, true) => "Q disagrees",
                    _ => "P disagrees",
                };
                let whom = if damaged {
                    "found damaged"
                } else {
                    "any of these may be damaged"
                };
                write!(f, "parity {which} with the data ({whom})")
            }
            ProblemKind::Moving { slot } => {
                write!(f, "slot {slot} differs at the place it is moving to")
            }
            ProblemKind::Checksum { blocks } => {
                write!(
                    f,
                    "{blocks} blocks fail their checksums (rebuilt from redundancy)"
                )
            }
            ProblemKind::Unrecoverable { blocks } => write!(
                f,
                "{blocks} blocks fail their checksums and no copy or reconstruction matches"
            ),
            ProblemKind::Unreadable => write!(f, "a read error (rebuilt from redundancy)"),
        }
    }
}

/// What a slot holds in a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Data {
        column: u32,
    },
    /// 0 for P, 1 for Q.
    Parity {
        index: u32,
    },
    Copy {
        column: u32,
        copy: u32,
    },
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Role::Data { column } => write!(f, "data column {column}"),
            Role::Parity { index: 0 } => write!(f, "parity P"),
            Role::Parity { .. } => write!(f, "parity Q"),
            Role::Copy { column, copy } => write!(f, "copy {copy} of column {column}"),
        }
    }
}

/// Where one slot's part of a row lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub slot: u32,
    pub role: Role,
    /// `None` when no place of the slot is readable now.
    pub disk: Option<DiskIndex>,
    /// Byte offset of the row's part on that disk (interleave bytes long).
    pub disk_offset: Option<u64>,
}

/// Where `slot` of the row of `io`, holding `role` there (its layout
/// says which), is read from now.
pub(crate) fn place<H: RowHost>(io: &RowIo<'_, H>, slot: u32, role: Role) -> Place {
    let geometry = io.geometry();
    let location = io.with_targets(|targets| targets[slot as usize].readable(io.row).cloned());
    Place {
        slot,
        role,
        disk: location.as_ref().map(|location| location.disk.index),
        disk_offset: location.map(|location| location.base + geometry.slab_offset(io.row, 0)),
    }
}

/// The disagreement of a parity row whose parity columns `wrong` (by
/// index) differ from what its `data` encodes to; `stored` is each
/// parity column as read, `role` the role of a slot in the row.
pub(crate) fn parity_problem<H: RowHost>(
    io: &RowIo<'_, H>,
    role: impl Fn(u32) -> Role,
    data: &[&[u8]],
    stored: &[Option<&[u8]>],
    wrong: &[bool],
) -> Problem {
    let geometry = io.geometry();
    let (p, q) = (wrong[0], wrong.get(1).copied().unwrap_or(false));
    let damaged_slot = match (stored, p, q) {
        // Dual parity: the one parity column that alone disagrees.
        ([_, _], true, false) => Some(geometry.parity_column(io.row, 0)),
        ([_, _], false, true) => Some(geometry.parity_column(io.row, 1)),
        ([Some(p), Some(q)], true, true) => {
            damaged_data_column(data, p, q).map(|column| geometry.physical_column(io.row, column))
        }
        _ => None,
    };
    let slots: Vec<u32> = match damaged_slot {
        Some(slot) => vec![slot],
        None => {
            let parity = (0..geometry.layout().parity_columns())
                .map(|index| geometry.parity_column(io.row, index));
            let data = (0..geometry.data_columns()).map(|c| geometry.physical_column(io.row, c));
            parity.chain(data).collect()
        }
    };
    Problem {
        kind: ProblemKind::Parity {
            p,
            q,
            damaged: damaged_slot.is_some(),
        },
        places: slots
            .into_iter()
            .map(|slot| place(io, slot, role(slot)))
            .collect(),
    }
}

/// The one data column whose replacement, rebuilt from P and the other
/// columns, makes Q agree as well, if there is exactly one.
fn damaged_data_column(data: &[&[u8]], p: &[u8], q: &[u8]) -> Option<u32> {
    let width = p.len();
    let mut found = None;
    for column in 0..data.len() {
        let mut rebuilt = p.to_vec();
        for (other, bytes) in data.iter().enumerate() {
            if other != column {
                terrace_ec::xor_into(&mut rebuilt, bytes);
            }
        }
        let mut columns: Vec<&[u8]> = data.to_vec();
        columns[column] = &rebuilt;
        let (mut p_again, mut q_again) = (vec![0u8; width], vec![0u8; width]);
        terrace_ec::encode_pq(&columns, &mut p_again, &mut q_again);
        if q_again == q {
            if found.is_some() {
                return None;
            }
            found = Some(column as u32);
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_damaged_data_column_is_found_by_dual_parity() {
        let columns: Vec<Vec<u8>> = (0..4u8)
            .map(|c| {
                (0..64u8)
                    .map(|i| i.wrapping_mul(7) ^ c.wrapping_mul(31))
                    .collect()
            })
            .collect();
        let data: Vec<&[u8]> = columns.iter().map(Vec::as_slice).collect();
        let (mut p, mut q) = (vec![0u8; 64], vec![0u8; 64]);
        terrace_ec::encode_pq(&data, &mut p, &mut q);
        for damaged in 0..4 {
            let mut bad = columns.clone();
            bad[damaged][5] ^= 0x5a;
            bad[damaged][60] ^= 0x01;
            let data: Vec<&[u8]> = bad.iter().map(Vec::as_slice).collect();
            assert_eq!(damaged_data_column(&data, &p, &q), Some(damaged as u32));
        }
    }
}
