//! Stripe-level reconstruction on top of a set of fast kernels. The cases and
//! their formulas are derived in the crate-level documentation; this file only
//! arranges buffers so that each case is a few whole-buffer kernel calls and
//! nothing is allocated: where a case needs a partial syndrome in memory, an
//! erased buffer holds it while it is being solved.
//!
//! Column lists are gathered in fixed arrays on the stack, sized for the
//! widest stripe: about 12 KiB of stack at most.

use crate::check::{self, Pattern};
use crate::field;
use crate::kernel::Kernels;
use crate::{EcError, MAX_DATA_COLUMNS, MAX_PARITY};

/// Read-only columns gathered on the stack (data columns, plus P as an extra
/// XOR source when solving from P), so kernels get a `&[&[u8]]` without a heap
/// allocation. 4 KiB of stack at most.
struct Gathered<'a> {
    columns: [&'a [u8]; MAX_DATA_COLUMNS + 1],
    count: usize,
}

impl<'a> Gathered<'a> {
    fn new() -> Self {
        Self {
            columns: [&[]; MAX_DATA_COLUMNS + 1],
            count: 0,
        }
    }

    fn push(&mut self, column: &'a [u8]) {
        self.columns[self.count] = column;
        self.count += 1;
    }

    fn as_slice(&self) -> &[&'a [u8]] {
        &self.columns[..self.count]
    }
}

/// A stripe split into what survived (read-only) and what was erased
/// (writable), so both can be borrowed at once.
struct Stripe<'a> {
    /// Data columns in order; `None` where erased.
    data: [Option<&'a [u8]>; MAX_DATA_COLUMNS],
    data_columns: usize,
    p: Option<&'a [u8]>,
    q: Option<&'a [u8]>,
}

impl<'a> Stripe<'a> {
    /// Splits `columns`; the erased buffers come back in ascending column
    /// order (so an erased data column always precedes an erased P or Q).
    fn split(
        columns: &'a mut [&mut [u8]],
        data_columns: usize,
        erased: &[usize],
    ) -> (Self, [Option<&'a mut [u8]>; MAX_PARITY]) {
        let mut stripe = Stripe {
            data: [None; MAX_DATA_COLUMNS],
            data_columns,
            p: None,
            q: None,
        };
        let mut lost: [Option<&'a mut [u8]>; MAX_PARITY] = [None, None];
        let mut lost_count = 0;
        for (index, column) in columns.iter_mut().enumerate() {
            if erased.contains(&index) {
                lost[lost_count] = Some(&mut **column);
                lost_count += 1;
            } else if index < data_columns {
                stripe.data[index] = Some(&**column);
            } else if index == data_columns {
                stripe.p = Some(&**column);
            } else {
                stripe.q = Some(&**column);
            }
        }
        (stripe, lost)
    }

    /// The data columns with holes where erased.
    fn data_with_holes(&self) -> &[Option<&'a [u8]>] {
        &self.data[..self.data_columns]
    }

    /// All data columns, with `rebuilt` standing in for the erased one.
    fn data_with<'b>(&self, column: usize, rebuilt: &'b [u8]) -> Gathered<'b>
    where
        'a: 'b,
    {
        let mut gathered = Gathered::new();
        for (index, bytes) in self.data_with_holes().iter().enumerate() {
            gathered.push(if index == column {
                rebuilt
            } else {
                bytes.expect("only one data column is erased")
            });
        }
        gathered
    }

    /// The surviving data columns followed by P: XOR-ing them gives the one
    /// missing data column.
    fn survivors_and_p(&self) -> Gathered<'a> {
        let mut gathered = Gathered::new();
        for bytes in self.data_with_holes().iter().flatten() {
            gathered.push(bytes);
        }
        gathered.push(self.p.expect("P survives in this case"));
        gathered
    }

    /// All data columns (none erased in the parity-only cases).
    fn all_data(&self) -> Gathered<'a> {
        let mut gathered = Gathered::new();
        for bytes in self.data_with_holes() {
            gathered.push(bytes.expect("no data column is erased in this case"));
        }
        gathered
    }
}

/// Takes the `slot`-th erased buffer out of the array `Stripe::split` returned.
fn take<'a>(lost: &mut [Option<&'a mut [u8]>; MAX_PARITY], slot: usize) -> &'a mut [u8] {
    lost[slot]
        .take()
        .expect("the pattern says this many columns are erased")
}

/// `reconstruct` for the fast implementations.
pub(crate) fn reconstruct(
    kernels: &Kernels,
    columns: &mut [&mut [u8]],
    parity: usize,
    erased: &[usize],
) -> Result<(), EcError> {
    let request = check::reconstruct_request(columns, parity, erased)?;
    let (stripe, mut lost) = Stripe::split(columns, request.data_columns, erased);
    match request.pattern {
        Pattern::Nothing => {}
        Pattern::P => (kernels.encode_p)(stripe.all_data().as_slice(), take(&mut lost, 0)),
        Pattern::Q => (kernels.encode_q)(stripe.all_data().as_slice(), take(&mut lost, 0)),
        Pattern::PQ => {
            let p = take(&mut lost, 0);
            let q = take(&mut lost, 1);
            (kernels.encode_pq)(stripe.all_data().as_slice(), p, q);
        }
        Pattern::Data { .. } => {
            (kernels.encode_p)(stripe.survivors_and_p().as_slice(), take(&mut lost, 0));
        }
        Pattern::DataAndQ { column } => {
            let rebuilt = take(&mut lost, 0);
            (kernels.encode_p)(stripe.survivors_and_p().as_slice(), rebuilt);
            let q = take(&mut lost, 1);
            (kernels.encode_q)(stripe.data_with(column, rebuilt).as_slice(), q);
        }
        Pattern::DataAndP { column } => {
            let rebuilt = take(&mut lost, 0);
            let p = take(&mut lost, 1);
            solve_from_q(kernels, &stripe, column, rebuilt, p);
        }
        Pattern::TwoData { low, high } => {
            let low_buffer = take(&mut lost, 0);
            let high_buffer = take(&mut lost, 1);
            solve_two_data(kernels, &stripe, low, high, low_buffer, high_buffer);
        }
    }
    Ok(())
}

/// One data column `x` and P lost: `Dx = g^-x · (Q ⊕ Σ_{i≠x} g^i·Di)`, then P
/// is recomputed. The P buffer holds the partial syndrome meanwhile.
fn solve_from_q(
    kernels: &Kernels,
    stripe: &Stripe<'_>,
    column: usize,
    rebuilt: &mut [u8],
    p: &mut [u8],
) {
    p.copy_from_slice(stripe.q.expect("Q survives when data and P are lost"));
    // p = Q ⊕ Σ_{i≠x} g^i·Di = g^x·Dx
    (kernels.accumulate_q)(stripe.data_with_holes(), p);
    rebuilt.fill(0);
    (kernels.mul_xor_into)(rebuilt, p, field::inverse(field::exp(column)));
    (kernels.encode_p)(stripe.data_with(column, rebuilt).as_slice(), p);
}

/// Two data columns `x < y` lost: one pass over the survivors forms the
/// partial syndromes `P ⊕ Pxy = Dx ⊕ Dy` and `Q ⊕ Qxy = g^x·Dx ⊕ g^y·Dy` in
/// registers and solves them with the coefficients derived in the crate
/// documentation.
fn solve_two_data(
    kernels: &Kernels,
    stripe: &Stripe<'_>,
    low: usize,
    high: usize,
    low_buffer: &mut [u8],
    high_buffer: &mut [u8],
) {
    let p = stripe.p.expect("P survives when two data columns are lost");
    let q = stripe.q.expect("Q survives when two data columns are lost");
    let (a, b) = two_data_coefficients(low, high);
    (kernels.rebuild_two)(
        stripe.data_with_holes(),
        [p, q],
        [low_buffer, high_buffer],
        [a, b],
    );
}

/// `(A, B)` with `Dx = A·(Dx ⊕ Dy) ⊕ B·(g^x·Dx ⊕ g^y·Dy)`:
/// `B = 1 / (g^x ⊕ g^y)` and `A = g^y · B`. The denominator is non-zero
/// because `x ≠ y` and both are below the order of g.
pub(crate) fn two_data_coefficients(low: usize, high: usize) -> (u8, u8) {
    let denominator = field::exp(low) ^ field::exp(high);
    let b = field::inverse(denominator);
    let a = field::mul(field::exp(high), b);
    (a, b)
}

#[cfg(test)]
mod tests {
    use super::two_data_coefficients;
    use crate::field::{self, GROUP_ORDER};
    use crate::MAX_DATA_COLUMNS;

    /// The constants agree with the form Linux md writes them in, which the
    /// crate documentation derives them from:
    /// `A = g^(y-x) / (g^(y-x) ⊕ 1)`, `B = g^-x / (g^(y-x) ⊕ 1)`.
    #[test]
    fn coefficients_match_the_md_form() {
        for low in 0..MAX_DATA_COLUMNS {
            for high in low + 1..MAX_DATA_COLUMNS {
                let gap = field::exp(high - low);
                let denominator = gap ^ 1;
                let a = field::div(gap, denominator);
                let b = field::div(field::exp(GROUP_ORDER - low), denominator);
                assert_eq!(
                    two_data_coefficients(low, high),
                    (a, b),
                    "x = {low}, y = {high}"
                );
            }
        }
    }

    /// And they solve the system: for every pair of unknowns, substituting
    /// back gives the syndromes.
    #[test]
    fn coefficients_solve_the_two_by_two_system() {
        let (low, high) = (3, 200);
        let (a, b) = two_data_coefficients(low, high);
        for low_value in 0..=255u8 {
            for high_value in [0u8, 1, 0x53, 0x80, 0xff] {
                let sum = low_value ^ high_value;
                let weighted = field::mul(field::exp(low), low_value)
                    ^ field::mul(field::exp(high), high_value);
                let solved = field::mul(a, sum) ^ field::mul(b, weighted);
                assert_eq!(solved, low_value);
                assert_eq!(sum ^ solved, high_value);
            }
        }
    }
}
