//! Newtypes for identities and indices, so an index, a count and a size
//! never mix.

use std::fmt;

/// A pool's identity: 128 random bits, chosen at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub [u8; 16]);

/// A disk's identity: 128 random bits, chosen when it joins a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DiskId(pub [u8; 16]);

/// A disk's position in the pool's disk table. Stable for the pool's life:
/// a removed disk keeps its row (state `Removed`) so slab references in
/// extent maps never shift.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DiskIndex(pub u16);

/// A slab's position on its disk (slab `n` starts at `data_offset + n × slab_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlabIndex(pub u32);

/// A space's identity within its pool; never reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpaceId(pub u64);

/// One slab: which disk, which slab on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlabRef {
    pub disk: DiskIndex,
    pub slab: SlabIndex,
}

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    for byte in bytes {
        write!(f, "{byte:02x}")?;
    }
    Ok(())
}

impl PoolId {
    pub fn from_random(high: u64, low: u64) -> Self {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&high.to_le_bytes());
        bytes[8..].copy_from_slice(&low.to_le_bytes());
        PoolId(bytes)
    }

    /// The first 8 hex digits: enough to tell pools apart in messages.
    pub fn short(&self) -> String {
        self.to_string()[..8].to_string()
    }
}

impl DiskId {
    pub fn from_random(high: u64, low: u64) -> Self {
        DiskId(PoolId::from_random(high, low).0)
    }
}

impl fmt::Display for PoolId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Display for DiskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Display for DiskIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "disk {}", self.0)
    }
}

impl fmt::Display for SlabRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.disk.0, self.slab.0)
    }
}
