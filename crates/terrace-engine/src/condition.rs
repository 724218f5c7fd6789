//! The run-time condition of a disk: the one word the data path checks
//! before using it, and what events report when it changes.
//!
//! Depends on nothing of the engine.

/// Run-time condition of a disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Condition {
    Online = 0,
    /// An I/O error latched it, or the metadata says failed.
    Failed = 1,
    /// Not present (not found at import, or vanished).
    Missing = 2,
    /// Present but not serving (stale copy, removed, retired hot spare...).
    Standby = 3,
}

impl Condition {
    pub(crate) fn from_u8(value: u8) -> Condition {
        match value {
            0 => Condition::Online,
            1 => Condition::Failed,
            2 => Condition::Missing,
            _ => Condition::Standby,
        }
    }
}
