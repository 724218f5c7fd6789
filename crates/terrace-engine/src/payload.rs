//! The bytes of a write on their way to the disks: one buffer, or buffers
//! that follow each other (a gathered row's pieces, as the client sent
//! them). Layout handlers cut it into the pieces each column gets; a piece
//! that lies within one buffer is a view of it, so a row gathered from
//! writes of one interleave each goes to the disks without a copy. Only a
//! piece that spans buffers is copied, into one aligned buffer.

use std::ops::Range;
use std::sync::Arc;

use terrace_io::{aligned_concat, Bytes};
use terrace_layout::BLOCK_BYTES;

#[derive(Clone, Debug)]
pub enum Payload {
    One(Bytes),
    /// Back to back, in order; none empty.
    Parts(Vec<Bytes>),
    /// One buffer, starting on a block boundary of its space, with the
    /// sums of its whole blocks (`block_sum`, taken as the bytes arrived
    /// from the client): `sums[k]` of bytes `k * BLOCK_BYTES ..`.
    Summed(Bytes, Arc<[u64]>),
}

impl Payload {
    /// Buffers back to back; a single one stays as it is.
    pub(crate) fn parts(mut parts: Vec<Bytes>) -> Payload {
        parts.retain(|part| !part.is_empty());
        if parts.len() == 1 {
            return Payload::One(parts.remove(0));
        }
        Payload::Parts(parts)
    }

    pub(crate) fn len(&self) -> usize {
        match self {
            Payload::One(bytes) | Payload::Summed(bytes, _) => bytes.len(),
            Payload::Parts(parts) => parts.iter().map(Bytes::len).sum(),
        }
    }

    /// Copy every byte into `out`, which is as long as the payload.
    pub(crate) fn copy_to(&self, out: &mut [u8]) {
        let parts = match self {
            Payload::One(bytes) | Payload::Summed(bytes, _) => std::slice::from_ref(bytes),
            Payload::Parts(parts) => &parts[..],
        };
        let mut at = 0;
        for part in parts {
            out[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
    }

    /// The bytes of `range`: a view where they lie in one buffer, else a
    /// copy. Panics if the range is out of bounds.
    pub(crate) fn slice(&self, range: Range<usize>) -> Bytes {
        let parts = match self {
            Payload::One(bytes) | Payload::Summed(bytes, _) => return bytes.slice(range),
            Payload::Parts(parts) => parts,
        };
        assert!(
            range.start <= range.end && range.end <= self.len(),
            "{range:?} out of bounds"
        );
        if range.is_empty() {
            return Bytes::new();
        }
        let mut start = 0;
        let mut pieces = Vec::new();
        for part in parts {
            let end = start + part.len();
            if range.start >= start && range.end <= end {
                return part.slice(range.start - start..range.end - start);
            }
            if range.start < end && range.end > start {
                pieces.push(&part[range.start.max(start) - start..range.end.min(end) - start]);
            }
            start = end;
        }
        aligned_concat(range.len(), pieces).freeze()
    }

    /// The sums of the whole blocks of `range` (block-aligned), where they
    /// came with the payload.
    pub(crate) fn sums(&self, range: Range<usize>) -> Option<&[u64]> {
        let Payload::Summed(_, sums) = self else {
            return None;
        };
        let block = BLOCK_BYTES as usize;
        if !range.start.is_multiple_of(block) || !range.end.is_multiple_of(block) {
            return None;
        }
        sums.get(range.start / block..range.end / block)
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Payload {
        Payload::One(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_within_a_part_are_views_and_across_parts_copies() {
        let parts: Vec<Bytes> = (0..3u8).map(|i| Bytes::from(vec![i; 8])).collect();
        let payload = Payload::parts(parts.clone());
        assert_eq!(payload.len(), 24);
        // Within the second part: the same memory.
        let view = payload.slice(9..15);
        assert_eq!(&view[..], &[1; 6]);
        assert_eq!(view.as_ptr(), parts[1][1..].as_ptr());
        // A whole part.
        assert_eq!(payload.slice(16..24).as_ptr(), parts[2].as_ptr());
        // Across all three.
        let across = payload.slice(6..18);
        assert_eq!(&across[..], &[0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2]);
        assert_eq!(payload.slice(5..5).len(), 0);
        // Copied out whole, part after part.
        let mut out = [9u8; 24];
        payload.copy_to(&mut out);
        assert_eq!(out[..], [[0u8; 8], [1; 8], [2; 8]].concat()[..]);
        // One part is one buffer.
        assert!(matches!(
            Payload::parts(vec![parts[0].clone()]),
            Payload::One(_)
        ));
        assert_eq!(
            Payload::from(parts[0].clone()).slice(2..4),
            parts[0].slice(2..4)
        );
    }
}
