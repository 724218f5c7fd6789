//! The interface between the stripe-level algorithms and the byte-crunching
//! implementations: a view of data columns that may have holes, and the table
//! of kernels each fast implementation supplies.

/// Data columns as the syndrome kernels see them: `count()` columns in order,
/// any of which may be absent. An absent column counts as all zeros, which is
/// how the partial syndromes of a stripe with erased columns are computed
/// without reading the erased buffers.
pub(crate) trait DataColumns {
    fn count(&self) -> usize;
    fn column(&self, index: usize) -> Option<&[u8]>;
}

impl DataColumns for [&[u8]] {
    #[inline]
    fn count(&self) -> usize {
        self.len()
    }

    #[inline]
    fn column(&self, index: usize) -> Option<&[u8]> {
        Some(self[index])
    }
}

impl DataColumns for [Option<&[u8]>] {
    #[inline]
    fn count(&self) -> usize {
        self.len()
    }

    #[inline]
    fn column(&self, index: usize) -> Option<&[u8]> {
        self[index]
    }
}

/// Data columns in order, `None` where a column is erased.
pub(crate) type ColumnsWithHoles<'a> = [Option<&'a [u8]>];

/// The surviving parity columns `[P, Q]`.
pub(crate) type ParityPair<'a> = [&'a [u8]; 2];

/// The two erased data columns `[x, y]`, `x < y`, to be rebuilt.
pub(crate) type LostPair<'a> = [&'a mut [u8]; 2];

/// The bytes from `start` onward of every column: lets a SIMD kernel hand the
/// tail it cannot fill a whole register with to a narrower kernel.
pub(crate) struct Suffix<'a, C: ?Sized> {
    pub columns: &'a C,
    pub start: usize,
}

impl<C: DataColumns + ?Sized> DataColumns for Suffix<'_, C> {
    #[inline]
    fn count(&self) -> usize {
        self.columns.count()
    }

    #[inline]
    fn column(&self, index: usize) -> Option<&[u8]> {
        self.columns.column(index).map(|bytes| &bytes[self.start..])
    }
}

/// The kernels the shared reconstruction code (`solve`) is written against.
/// Each fast implementation fills one of these with its own functions; the
/// crate root picks one at run time. All buffers passed to one call have the
/// same length.
pub(crate) struct Kernels {
    pub name: &'static str,
    /// `p = XOR of sources`.
    pub encode_p: fn(&[&[u8]], &mut [u8]),
    /// `q = Σ g^i · data[i]`.
    pub encode_q: fn(&[&[u8]], &mut [u8]),
    /// Both of the above in one pass.
    pub encode_pq: fn(&[&[u8]], &mut [u8], &mut [u8]),
    /// `q ^= Σ g^i · data[i]` over the present columns.
    pub accumulate_q: fn(&ColumnsWithHoles, &mut [u8]),
    /// `destination ^= source`.
    pub xor_into: fn(&mut [u8], &[u8]),
    /// `destination ^= coefficient · source`.
    pub mul_xor_into: fn(&mut [u8], &[u8], u8),
    /// Two data columns `x < y` lost: `rebuild_two(data, [P, Q], [x, y], [A, B])`
    /// computes, in one pass over the survivors,
    /// `sum = P ⊕ Pxy`, `weighted = Q ⊕ Qxy` (the erased columns are the
    /// holes in `data`), then `x = A·sum ⊕ B·weighted` and `y = sum ⊕ x`.
    pub rebuild_two: fn(&ColumnsWithHoles, ParityPair, LostPair, [u8; 2]),
}
