//! One implementation per layout, behind one interface.
//!
//! Everything that differs between simple, mirror and parity rows is a
//! method of [`RowLayout`]: reading and writing a span of one row, the
//! content of one slot's row as the others define it (rebuilds, moves and
//! catch-ups), checking a row's redundancy (verify, resync), zeroing a
//! partial row, the write size that needs no read, and what a slot holds
//! in a row (the role a verify's finding names). Each layout implements it
//! in its own file; [`Layouts`] wraps the three, is chosen once from the
//! space's [`Layout`] when the space is built, and dispatches statically
//! (a `match` per row span, no `dyn`).
//!
//! ```text
//!   Space ─ zero / rebuild / resync
//!             └─ Layouts ─ simple.rs | mirror.rs | parity.rs
//!                              └─ verify (what a finding names) ─ row ─ target ─ disk
//! ```
//!
//! May depend on: `row`, `verify`, `payload`, `error` and what they depend
//! on, `terrace_ec`, `terrace_layout`.

pub(crate) mod failure;
pub(crate) mod mirror;
pub(crate) mod parity;
pub(crate) mod reason;
pub(crate) mod simple;

use std::future::Future;

use terrace_io::BytesMut;
use terrace_layout::{Geometry, Layout, RowSpan};

use crate::error::EngineError;
use crate::payload::Payload;
use crate::row::{RowHost, RowIo};
use crate::verify::{Problem, Role};

pub(crate) use failure::RowFailure;
pub(crate) use mirror::Mirror;
pub(crate) use parity::Parity;
pub(crate) use simple::Simple;

/// How a range is zeroed.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ZeroMode {
    Zeroes { fua: bool },
    Trim,
}

impl ZeroMode {
    pub(crate) fn fua(self) -> bool {
        matches!(self, ZeroMode::Zeroes { fua: true })
    }
}

/// What comparing a row's redundancy found (see [`RowLayout::compare`]).
pub(crate) enum Compared {
    /// The layout keeps no redundancy: nothing to compare.
    NoRedundancy,
    /// The row cannot be checked (a slot its check needs is unreadable).
    Unreadable,
    /// Compared; `partly`: some part could not be (a mirror column with no
    /// readable copy).
    Checked { partly: bool },
}

/// What a layout does with the rows of a space.
pub(crate) trait RowLayout {
    /// Read the block-aligned `span` of the row of `io` into `buffer`.
    fn read<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        buffer: BytesMut,
    ) -> impl Future<Output = (BytesMut, Result<(), EngineError>)>;

    /// Write the block-aligned `span` of the row of `io` from `data`.
    fn write<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        data: &Payload,
        fua: bool,
    ) -> impl Future<Output = Result<(), EngineError>>;

    /// The whole row (one interleave) of `slot` from the row's other slots
    /// (another copy, or rebuilt from the other columns); the caller holds
    /// the row lock.
    fn slot_content<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        slot: u32,
    ) -> impl Future<Output = Result<BytesMut, RowFailure>>;

    /// Compare the redundancy of the row of `io`, read whole into `slots`
    /// (`None` for a slot unreadable): what disagrees goes to `problems`,
    /// and the content each wrong slot should have to `fixes`.
    fn compare<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        slots: &[Option<BytesMut>],
        fixes: &mut Vec<(u32, BytesMut)>,
        problems: &mut Vec<Problem>,
    ) -> Compared;

    /// Zero `span`, part of one row (whole rows are zeroed on every slot
    /// alike, whatever the layout).
    fn zero_span<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        mode: ZeroMode,
    ) -> impl Future<Output = Result<(), EngineError>>;

    /// The write size that avoids reading before writing.
    fn natural_write_bytes(&self, geometry: &Geometry) -> u64;

    /// What `slot` holds in `row` (what a verify's finding names).
    fn role(&self, geometry: &Geometry, row: u64, slot: u32) -> Role;

    /// Whether, after an unclean shutdown, the rows the write intent names
    /// are resynchronised while the space serves (each before it is read)
    /// rather than before it serves. Mirrors can: a read resynchronises its
    /// row first. Parity cannot: stale parity would feed partial-row
    /// updates and reconstruction.
    fn resyncs_while_serving(&self) -> bool {
        false
    }
}

/// The layout of a space: one of the three, chosen once.
#[derive(Clone, Copy)]
pub(crate) enum Layouts {
    Simple(Simple),
    Mirror(Mirror),
    Parity(Parity),
}

impl Layouts {
    /// The implementation of `layout`: the one place a layout is registered.
    pub(crate) fn of(layout: Layout) -> Layouts {
        match layout {
            Layout::Simple => Layouts::Simple(Simple),
            Layout::Mirror { copies } => Layouts::Mirror(Mirror { copies }),
            Layout::Parity { redundancy } => Layouts::Parity(Parity { redundancy }),
        }
    }
}

impl RowLayout for Layouts {
    async fn read<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        buffer: BytesMut,
    ) -> (BytesMut, Result<(), EngineError>) {
        let read = match self {
            Layouts::Simple(layout) => layout.read(io, span, buffer).await,
            Layouts::Mirror(layout) => layout.read(io, span, buffer).await,
            // Boxed: a parity read's state (reconstruction) is far larger
            // than the others', and every read's future would carry it.
            Layouts::Parity(layout) => Box::pin(layout.read(io, span, buffer)).await,
        };
        rewrite_unreadable(self, io).await;
        read
    }

    async fn write<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        data: &Payload,
        fua: bool,
    ) -> Result<(), EngineError> {
        let written = match self {
            Layouts::Simple(layout) => layout.write(io, span, data, fua).await,
            Layouts::Mirror(layout) => layout.write(io, span, data, fua).await,
            // Boxed, as for reads: a parity update's state is the largest.
            Layouts::Parity(layout) => Box::pin(layout.write(io, span, data, fua)).await,
        };
        rewrite_unreadable(self, io).await;
        written
    }

    async fn slot_content<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        slot: u32,
    ) -> Result<BytesMut, RowFailure> {
        match self {
            Layouts::Simple(layout) => layout.slot_content(io, slot).await,
            Layouts::Mirror(layout) => layout.slot_content(io, slot).await,
            Layouts::Parity(layout) => layout.slot_content(io, slot).await,
        }
    }

    fn compare<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        slots: &[Option<BytesMut>],
        fixes: &mut Vec<(u32, BytesMut)>,
        problems: &mut Vec<Problem>,
    ) -> Compared {
        match self {
            Layouts::Simple(layout) => layout.compare(io, slots, fixes, problems),
            Layouts::Mirror(layout) => layout.compare(io, slots, fixes, problems),
            Layouts::Parity(layout) => layout.compare(io, slots, fixes, problems),
        }
    }

    async fn zero_span<H: RowHost>(
        &self,
        io: &RowIo<'_, H>,
        span: &RowSpan,
        mode: ZeroMode,
    ) -> Result<(), EngineError> {
        match self {
            Layouts::Simple(layout) => layout.zero_span(io, span, mode).await,
            Layouts::Mirror(layout) => layout.zero_span(io, span, mode).await,
            Layouts::Parity(layout) => layout.zero_span(io, span, mode).await,
        }
    }

    fn natural_write_bytes(&self, geometry: &Geometry) -> u64 {
        match self {
            Layouts::Simple(layout) => layout.natural_write_bytes(geometry),
            Layouts::Mirror(layout) => layout.natural_write_bytes(geometry),
            Layouts::Parity(layout) => layout.natural_write_bytes(geometry),
        }
    }

    fn role(&self, geometry: &Geometry, row: u64, slot: u32) -> Role {
        match self {
            Layouts::Simple(layout) => layout.role(geometry, row, slot),
            Layouts::Mirror(layout) => layout.role(geometry, row, slot),
            Layouts::Parity(layout) => layout.role(geometry, row, slot),
        }
    }

    fn resyncs_while_serving(&self) -> bool {
        match self {
            Layouts::Simple(layout) => layout.resyncs_while_serving(),
            Layouts::Mirror(layout) => layout.resyncs_while_serving(),
            Layouts::Parity(layout) => layout.resyncs_while_serving(),
        }
    }
}

/// Rewrite the row of each slot whose read failed in `io` on a disk still
/// in service (an unreadable sector), from the row's other slots, under the
/// row's lock: the drive remaps the sector as it takes the write, and the
/// next read finds the data there again. A slot nothing rebuilds (no
/// redundancy left, or a simple layout) is left as it is; a rewrite that
/// fails fails its disk. Each is told to the host. Called once the layout
/// has served the I/O from the other slots, and by a parity write before
/// it lets go of the row: a write that left out a data column whose old
/// bytes it could not read must not leave that column stale for a reader.
pub(crate) async fn rewrite_unreadable<L: RowLayout, H: RowHost>(layout: &L, io: &RowIo<'_, H>) {
    if io.unreadable_slots().is_empty() {
        return;
    }
    let _guard = io.lock().await;
    rewrite_unreadable_locked(layout, io).await;
}

/// [`rewrite_unreadable`] for a caller that holds the row's lock.
pub(crate) async fn rewrite_unreadable_locked<L: RowLayout, H: RowHost>(
    layout: &L,
    io: &RowIo<'_, H>,
) {
    for (slot, disk) in io.unreadable_slots() {
        // The other unreadable slots stay out of the rebuild's sources.
        let rewritten = io.host.may_rewrite()
            && match layout.slot_content(io, slot).await {
                Ok(content) => io.write(slot, 0, content.freeze(), true).await.is_ok(),
                Err(_) => false,
            };
        io.forget_unreadable(slot);
        io.host.read_failed(disk, io.extent, io.row, rewritten);
    }
}

/// What the code above the layouts needs of a space besides its rows: the
/// layout it was built with.
pub(crate) trait LayoutHost: RowHost {
    fn layout(&self) -> &Layouts;

    /// The sums of the space's blocks, if it keeps them.
    fn sums(&self) -> Option<&crate::sums::SpaceSums> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roles(layout: Layout, columns: u32, row: u64) -> Vec<Role> {
        let geometry = Geometry::new(layout, columns, 64 << 10, 1 << 30).expect("a geometry");
        let layouts = Layouts::of(layout);
        (0..geometry.slots_per_extent())
            .map(|slot| layouts.role(&geometry, row, slot))
            .collect()
    }

    /// Each layout names what every slot of a row holds: simple slots are
    /// their columns, mirror copies are consecutive, parity rotates.
    #[test]
    fn each_layout_names_the_role_of_every_slot() {
        let data = |column| Role::Data { column };
        assert_eq!(roles(Layout::Simple, 3, 5), [data(0), data(1), data(2)]);
        let copy = |column, copy| Role::Copy { column, copy };
        assert_eq!(
            roles(Layout::Mirror { copies: 2 }, 2, 5),
            [copy(0, 0), copy(0, 1), copy(1, 0), copy(1, 1)]
        );
        let layout = Layout::Parity { redundancy: 2 };
        let geometry = Geometry::new(layout, 5, 64 << 10, 1 << 30).expect("a geometry");
        for row in 0..5 {
            let roles = roles(layout, 5, row);
            for index in 0..2 {
                let slot = geometry.parity_column(row, index);
                assert_eq!(roles[slot as usize], Role::Parity { index });
            }
            for column in 0..3 {
                let slot = geometry.physical_column(row, column);
                assert_eq!(roles[slot as usize], data(column));
            }
        }
        assert_ne!(roles(layout, 5, 0), roles(layout, 5, 1), "parity rotates");
    }
}
