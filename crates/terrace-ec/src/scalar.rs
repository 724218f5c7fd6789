//! The reference implementation: one byte at a time, straight from the
//! definitions, with every multiplication done through the log/exp tables.
//! Q is computed as the plain sum `Σ g^i · Di`, not by Horner's rule, and
//! reconstruction solves each byte position on its own, so this module shares
//! no algorithm with the fast ones. It is slow, and it is the oracle the tests
//! hold the fast implementations to.

use crate::check::{self, Pattern};
use crate::{field, EcError};

/// `p` = XOR of the data columns.
pub fn encode_p(data: &[&[u8]], p: &mut [u8]) {
    check::data_columns(data, p.len());
    for (offset, parity) in p.iter_mut().enumerate() {
        *parity = data.iter().fold(0, |sum, column| sum ^ column[offset]);
    }
}

/// `p` = XOR of the data columns, `q = Σ g^i · data[i]`.
pub fn encode_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    check::data_columns(data, p.len());
    check::same_length(q, p);
    encode_p(data, p);
    for (offset, syndrome) in q.iter_mut().enumerate() {
        *syndrome = q_byte(data.iter().map(|column| Some(column[offset])));
    }
}

/// `destination ^= source`.
pub fn xor_into(destination: &mut [u8], source: &[u8]) {
    check::same_length(destination, source);
    for (target, byte) in destination.iter_mut().zip(source) {
        *target ^= byte;
    }
}

/// `destination ^= coefficient · source`.
pub fn mul_xor_into(destination: &mut [u8], source: &[u8], coefficient: u8) {
    check::same_length(destination, source);
    for (target, byte) in destination.iter_mut().zip(source) {
        *target ^= field::mul(coefficient, *byte);
    }
}

/// Rebuilds the erased columns of a stripe; see [`crate::reconstruct`].
pub fn reconstruct(
    columns: &mut [&mut [u8]],
    parity: usize,
    erased: &[usize],
) -> Result<(), EcError> {
    let request = check::reconstruct_request(columns, parity, erased)?;
    let length = columns[0].len();
    for offset in 0..length {
        let mut stripe = ByteStripe::read(columns, request.data_columns, parity, offset);
        stripe.solve(request.pattern);
        stripe.write(columns, offset);
    }
    Ok(())
}

/// `Σ g^i · bytes[i]`, an absent byte counting as zero.
fn q_byte(bytes: impl Iterator<Item = Option<u8>>) -> u8 {
    bytes.enumerate().fold(0, |sum, (column, byte)| {
        sum ^ byte.map_or(0, |value| field::mul(field::exp(column), value))
    })
}

/// One byte from every column of a stripe, the erased ones untrusted.
struct ByteStripe {
    /// Data bytes followed by P (and Q): one per column, as in `columns`.
    bytes: [u8; crate::MAX_DATA_COLUMNS + crate::MAX_PARITY],
    data_columns: usize,
    parity: usize,
}

impl ByteStripe {
    fn read(columns: &[&mut [u8]], data_columns: usize, parity: usize, offset: usize) -> Self {
        let mut bytes = [0; crate::MAX_DATA_COLUMNS + crate::MAX_PARITY];
        for (byte, column) in bytes.iter_mut().zip(columns) {
            *byte = column[offset];
        }
        Self {
            bytes,
            data_columns,
            parity,
        }
    }

    fn write(&self, columns: &mut [&mut [u8]], offset: usize) {
        for (column, byte) in columns.iter_mut().zip(self.bytes) {
            column[offset] = byte;
        }
    }

    /// The data bytes, with the listed columns treated as zero.
    fn data_except<'a>(&'a self, missing: &'a [usize]) -> impl Iterator<Item = Option<u8>> + 'a {
        self.bytes[..self.data_columns]
            .iter()
            .enumerate()
            .map(move |(column, byte)| (!missing.contains(&column)).then_some(*byte))
    }

    fn p_except(&self, missing: &[usize]) -> u8 {
        self.data_except(missing)
            .flatten()
            .fold(0, |sum, byte| sum ^ byte)
    }

    fn q_except(&self, missing: &[usize]) -> u8 {
        q_byte(self.data_except(missing))
    }

    fn recompute_p(&mut self) {
        self.bytes[self.data_columns] = self.p_except(&[]);
    }

    fn recompute_q(&mut self) {
        debug_assert_eq!(self.parity, 2, "Q is recomputed only in a stripe with Q");
        self.bytes[self.data_columns + 1] = self.q_except(&[]);
    }

    fn solve(&mut self, pattern: Pattern) {
        let p = self.bytes[self.data_columns];
        // Without Q this reads an unused slot; no single-parity case uses it.
        let q = self.bytes[self.data_columns + 1];
        match pattern {
            Pattern::Nothing => {}
            Pattern::P => self.recompute_p(),
            Pattern::Q => self.recompute_q(),
            Pattern::PQ => {
                self.recompute_p();
                self.recompute_q();
            }
            Pattern::Data { column } => self.bytes[column] = p ^ self.p_except(&[column]),
            Pattern::DataAndQ { column } => {
                self.bytes[column] = p ^ self.p_except(&[column]);
                self.recompute_q();
            }
            Pattern::DataAndP { column } => {
                // g^x·Dx = Q ⊕ Σ_{i≠x} g^i·Di
                let scaled = q ^ self.q_except(&[column]);
                self.bytes[column] = field::div(scaled, field::exp(column));
                self.recompute_p();
            }
            Pattern::TwoData { low, high } => {
                // sum = Dx ⊕ Dy, weighted = g^x·Dx ⊕ g^y·Dy. Substituting
                // Dy = sum ⊕ Dx: weighted ⊕ g^y·sum = (g^x ⊕ g^y)·Dx.
                let sum = p ^ self.p_except(&[low, high]);
                let weighted = q ^ self.q_except(&[low, high]);
                let low_value = field::div(
                    weighted ^ field::mul(field::exp(high), sum),
                    field::exp(low) ^ field::exp(high),
                );
                self.bytes[low] = low_value;
                self.bytes[high] = sum ^ low_value;
            }
        }
    }
}
