//! Finding which copy is right: every data block of a row checked against
//! its sum, and a block that fails rebuilt from what passes.
//!
//! A row is read whole from every slot (as a verify reads it). Then, block
//! by block (4 KiB at the same offset of each slot's interleave):
//!
//! - **mirror**: each column's copies are tried in turn; the first whose
//!   block matches the column's sum is the truth, and every readable copy
//!   that does not match is given its bytes;
//! - **parity**: if a data block fails its sum, the columns are taken as
//!   lost in every combination the layout can rebuild (one column, then for
//!   dual parity each pair; slots that could not be read are always among
//!   them) until the rebuilt data matches every sum it has; the columns
//!   rebuilt that differ from what was read are rewritten;
//! - **simple**: nothing to rebuild from: a block that fails stays failed.
//!
//! After a crash (`resync`), a mirror block no copy of which matches its
//! stored sum (a write cut by the crash left the copies new and the sum
//! old, and a disk damaged one of them) takes the content most copies
//! agree on, where more than half of the readable copies do: a copy
//! damaged before the crash is outvoted rather than copied over the rest
//! and its sum learned from it.
//!
//! A block whose sum is not known (0: never written since its space had
//! sums) is not checked, and a block matching the sum of a write still in
//! flight passes (see [`SpaceSums`]). A block no copy or combination
//! satisfies is unrecoverable: a read of it fails, it is never returned.
//!
//! The caller holds the row lock; this module only computes what the row
//! should hold (`RowHeal`), leaving the writing to the caller (a read
//! repairs, a read-only verify does not).
//!
//! May depend on: `layouts`, `row`, `sums`, `terrace_ec`, `terrace_layout`.

use terrace_io::{aligned_buffer, BytesMut};
use terrace_layout::{Geometry, BLOCK_BYTES};
use terrace_meta::sums::{block_matches, block_sum};

use crate::layouts::{LayoutHost, Layouts};
use crate::row::RowIo;
use crate::sums::SpaceSums;

/// What checking one row against its sums found.
#[derive(Default)]
pub(crate) struct RowHeal {
    /// Slots whose content was wrong, with their content as it should be
    /// (whole interleave), and how many of their blocks were wrong.
    pub fixes: Vec<(u32, BytesMut, u64)>,
    /// Space block indices of the data blocks nothing could rebuild.
    pub unrecoverable: Vec<u64>,
    /// Each data column's content as the sums say it is (whole
    /// interleave); `None` for a column with no readable slot.
    pub columns: Vec<Option<BytesMut>>,
}

/// The space block index of the first block of `row` of `extent`.
pub(crate) fn first_block(geometry: &Geometry, extent: u64, row: u64) -> u64 {
    (extent * geometry.extent_data_bytes() + row * geometry.row_data_bytes()) / BLOCK_BYTES
}

/// Check the row of `io`, read whole into `slots` (`None`: unreadable),
/// against `sums`, and say what it should hold; `resync`: after a crash
/// (see the module's comment).
pub(crate) async fn heal_row<H: LayoutHost>(
    io: &RowIo<'_, H>,
    sums: &SpaceSums,
    slots: &[Option<BytesMut>],
    resync: bool,
) -> RowHeal {
    let geometry = io.geometry();
    let first = first_block(geometry, io.extent, io.row);
    let blocks = geometry.row_data_bytes() / BLOCK_BYTES;
    let expected = sums.get(first..first + blocks).await;
    let check = Check {
        sums,
        expected: &expected,
        first,
        per_column: geometry.interleave_bytes() / BLOCK_BYTES,
        resync,
    };
    match io.host.layout() {
        Layouts::Simple(_) => simple(geometry, io.row, slots, &check),
        Layouts::Mirror(mirror) => mirrored(geometry, mirror.copies, slots, &check),
        Layouts::Parity(parity) => {
            with_parity(geometry, io.row, parity.redundancy as usize, slots, &check)
        }
    }
}

/// The sums of one row's data blocks.
struct Check<'a> {
    sums: &'a SpaceSums,
    /// Per data block of the row, column by column.
    expected: &'a [u64],
    first: u64,
    per_column: u64,
    /// After a crash: a mirror block no copy of which passes takes the
    /// content most copies hold.
    resync: bool,
}

impl Check<'_> {
    /// The space block index of block `k` of data column `column`.
    fn block(&self, column: u32, k: u64) -> u64 {
        self.first + u64::from(column) * self.per_column + k
    }

    /// Whether `bytes`, as block `k` of data column `column`, is what its
    /// sum says (or its sum is not known).
    fn passes(&self, column: u32, k: u64, bytes: &[u8]) -> bool {
        let block = self.block(column, k);
        let expected = self.expected[(block - self.first) as usize];
        if block_matches(bytes, block, expected) {
            return true;
        }
        self.sums.in_flight(block, block_sum(bytes, block))
    }
}

fn block_range(k: u64) -> std::ops::Range<usize> {
    (k * BLOCK_BYTES) as usize..((k + 1) * BLOCK_BYTES) as usize
}

fn simple(geometry: &Geometry, row: u64, slots: &[Option<BytesMut>], check: &Check) -> RowHeal {
    let mut heal = RowHeal::default();
    for column in 0..geometry.data_columns() {
        let slot = geometry.slot(geometry.physical_column(row, column), 0);
        let content = slots[slot as usize].clone();
        if let Some(content) = &content {
            for k in 0..check.per_column {
                if !check.passes(column, k, &content[block_range(k)]) {
                    heal.unrecoverable.push(check.block(column, k));
                }
            }
        }
        heal.columns.push(content);
    }
    heal
}

fn mirrored(
    geometry: &Geometry,
    copies: u32,
    slots: &[Option<BytesMut>],
    check: &Check,
) -> RowHeal {
    let mut heal = RowHeal::default();
    for column in 0..geometry.columns() {
        let copy_slots: Vec<u32> = (0..copies)
            .map(|copy| geometry.slot(column, copy))
            .collect();
        let mut contents: Vec<Option<BytesMut>> = copy_slots
            .iter()
            .map(|&slot| slots[slot as usize].clone())
            .collect();
        let mut wrong = vec![0u64; copies as usize];
        for k in 0..check.per_column {
            let range = block_range(k);
            let passing: Vec<bool> = contents
                .iter()
                .map(|content| {
                    content
                        .as_ref()
                        .is_some_and(|content| check.passes(column, k, &content[range.clone()]))
                })
                .collect();
            let good = passing.iter().position(|&passes| passes).or_else(|| {
                check
                    .resync
                    .then(|| majority(&contents, range.clone()))
                    .flatten()
            });
            let Some(good) = good else {
                if contents.iter().any(Option::is_some) {
                    heal.unrecoverable.push(check.block(column, k));
                }
                continue;
            };
            let truth = contents[good].as_ref().map(|c| c[range.clone()].to_vec());
            let Some(truth) = truth else { continue };
            for (copy, content) in contents.iter_mut().enumerate() {
                if let (Some(content), false) = (content.as_mut(), passing[copy]) {
                    if content[range.clone()] != truth[..] {
                        content[range.clone()].copy_from_slice(&truth);
                        wrong[copy] += 1;
                    }
                }
            }
        }
        for (copy, &blocks) in wrong.iter().enumerate() {
            if blocks > 0 {
                if let Some(content) = &contents[copy] {
                    heal.fixes.push((copy_slots[copy], content.clone(), blocks));
                }
            }
        }
        heal.columns.push(contents.into_iter().flatten().next());
    }
    heal
}

/// The copy whose bytes over `range` more than half of the readable
/// copies hold (at least two), if one is.
fn majority(contents: &[Option<BytesMut>], range: std::ops::Range<usize>) -> Option<usize> {
    let readable: Vec<(usize, &[u8])> = contents
        .iter()
        .enumerate()
        .filter_map(|(copy, content)| Some((copy, &content.as_ref()?[range.clone()])))
        .collect();
    readable.iter().find_map(|&(copy, bytes)| {
        let agreeing = readable.iter().filter(|(_, other)| *other == bytes).count();
        (agreeing >= 2 && agreeing * 2 > readable.len()).then_some(copy)
    })
}

/// The combinations of at most `most` of `count` columns that include all
/// of `must`, smallest first.
fn erasure_sets(count: usize, most: usize, must: &[usize]) -> Vec<Vec<usize>> {
    let mut sets = Vec::new();
    for size in must.len()..=most {
        let mut set = Vec::new();
        choose(0, count, size, &mut set, &mut sets);
    }
    sets.retain(|set| must.iter().all(|m| set.contains(m)));
    sets
}

fn choose(from: usize, count: usize, size: usize, set: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
    if set.len() == size {
        out.push(set.clone());
        return;
    }
    for next in from..count {
        set.push(next);
        choose(next + 1, count, size, set, out);
        set.pop();
    }
}

fn with_parity(
    geometry: &Geometry,
    row: u64,
    redundancy: usize,
    slots: &[Option<BytesMut>],
    check: &Check,
) -> RowHeal {
    let data = geometry.data_columns() as usize;
    // Columns in the order the erasure code takes them: data, then P, Q.
    let slot_of: Vec<u32> = (0..data as u32)
        .map(|column| geometry.slot(geometry.physical_column(row, column), 0))
        .chain(
            (0..redundancy as u32)
                .map(|index| geometry.slot(geometry.parity_column(row, index), 0)),
        )
        .collect();
    let width = geometry.interleave_bytes() as usize;
    let unreadable: Vec<usize> = (0..slot_of.len())
        .filter(|&i| slots[slot_of[i] as usize].is_none())
        .collect();
    let mut contents: Vec<BytesMut> = slot_of
        .iter()
        .map(|&slot| {
            slots[slot as usize]
                .clone()
                .unwrap_or_else(|| aligned_buffer(width))
        })
        .collect();
    let mut wrong = vec![0u64; slot_of.len()];
    let mut heal = RowHeal::default();
    let mut lost_columns = vec![false; data];
    // The same for every block of the row: computed once.
    let candidates: Vec<Vec<usize>> = if unreadable.len() <= redundancy {
        erasure_sets(slot_of.len(), redundancy, &unreadable)
            .into_iter()
            .filter(|erased| !erased.is_empty())
            .collect()
    } else {
        Vec::new()
    };
    for k in 0..check.per_column {
        let range = block_range(k);
        let failing = (0..data).any(|c| {
            !unreadable.contains(&c) && !check.passes(c as u32, k, &contents[c][range.clone()])
        });
        let data_unreadable = unreadable.iter().any(|&i| i < data);
        if !failing && !data_unreadable {
            continue;
        }
        let mut solved = false;
        for erased in &candidates {
            let mut stripe: Vec<Vec<u8>> =
                contents.iter().map(|c| c[range.clone()].to_vec()).collect();
            let mut views: Vec<&mut [u8]> = stripe.iter_mut().map(|v| &mut v[..]).collect();
            if terrace_ec::reconstruct(&mut views, redundancy, erased).is_err() {
                continue;
            }
            if !(0..data).all(|c| check.passes(c as u32, k, &stripe[c])) {
                continue;
            }
            for &i in erased {
                if contents[i][range.clone()] != stripe[i][..] {
                    contents[i][range.clone()].copy_from_slice(&stripe[i]);
                    if !unreadable.contains(&i) {
                        wrong[i] += 1;
                    }
                }
            }
            solved = true;
            break;
        }
        if !solved {
            for c in 0..data {
                let bad = unreadable.contains(&c)
                    || !check.passes(c as u32, k, &contents[c][range.clone()]);
                if bad {
                    heal.unrecoverable.push(check.block(c as u32, k));
                    if unreadable.contains(&c) {
                        lost_columns[c] = true;
                    }
                }
            }
        }
    }
    for (i, &blocks) in wrong.iter().enumerate() {
        if blocks > 0 {
            heal.fixes.push((slot_of[i], contents[i].clone(), blocks));
        }
    }
    heal.columns = contents
        .into_iter()
        .take(data)
        .enumerate()
        .map(|(c, content)| (!lost_columns[c]).then_some(content))
        .collect();
    heal
}

#[cfg(test)]
mod tests {
    use super::erasure_sets;

    /// Combinations come smallest first and always hold the columns that
    /// must be among them.
    #[test]
    fn erasure_sets_hold_what_must_be_lost_smallest_first() {
        assert_eq!(
            erasure_sets(4, 1, &[]),
            vec![vec![], vec![0], vec![1], vec![2], vec![3]]
        );
        assert_eq!(erasure_sets(4, 2, &[2]).first(), Some(&vec![2]));
        assert!(erasure_sets(4, 2, &[2]).iter().all(|set| set.contains(&2)));
        assert_eq!(erasure_sets(5, 2, &[]).len(), 1 + 5 + 10);
        assert!(erasure_sets(3, 1, &[0, 1]).is_empty());
    }
}
