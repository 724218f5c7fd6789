//! What `pool create`, `disk add` and `disk replace` check about the disks
//! they are given before they write to any of them:
//!
//! * each is given once and is no open pool's disk already, compared by
//!   what the path leads to (a block device's device number, a file's
//!   device and inode), not by how it is spelled: `f.img` and
//!   `../dir/f.img` are one disk;
//! * none holds something (a file system, swap, an encrypted volume,
//!   another volume manager's or RAID's member, a partition table; see
//!   [`super::probe`]; or the label of a terrace pool not open here),
//!   unless forced. Forced, what was found is wiped (its magic numbers, as
//!   `wipefs` does; a terrace label as `pool destroy` erases it) so that no
//!   tool takes the disk for what it was once terrace has written to it.
//!
//! A disk carrying the label of the pool the command is for, or of
//! another pool open here, is left to the engine: it knows whether it is
//! a missing member coming back, and refuses the others, forced or not.

use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::sync::Arc;

use terrace_engine::io::file::{FileDevice, FileOptions};
use terrace_engine::io::BlockDevice;
use terrace_engine::DeviceKind;

use super::probe::{probe_path, Signature};
use super::registry::Registry;
use crate::api::ErrorKind;

/// What a path leads to, whatever its spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Identity {
    Block { device_number: u64 },
    File { device_number: u64, inode: u64 },
}

pub fn identity(path: &str) -> std::io::Result<Identity> {
    let metadata = std::fs::metadata(path)?;
    Ok(if metadata.file_type().is_block_device() {
        Identity::Block {
            device_number: metadata.rdev(),
        }
    } else {
        Identity::File {
            device_number: metadata.dev(),
            inode: metadata.ino(),
        }
    })
}

type Refusal = (ErrorKind, String);

/// Refuse disks given twice, or already open in a pool, by identity.
/// Paths that cannot be looked at are left to the open that follows,
/// which says why.
pub fn check_identities(registry: &Registry, paths: &[&str]) -> Result<(), Refusal> {
    let mut seen: Vec<(Identity, &str)> = Vec::new();
    for &path in paths {
        let Ok(id) = identity(path) else { continue };
        if let Some((_, first)) = seen.iter().find(|(known, _)| *known == id) {
            return Err((
                ErrorKind::Failure,
                format!("{first} and {path} are the same disk, given twice; nothing was changed"),
            ));
        }
        seen.push((id, path));
    }
    for entry in registry.all() {
        for (index, device) in entry.pool.online_devices() {
            let Ok(id) = identity(&device) else { continue };
            if let Some((_, path)) = seen.iter().find(|(known, _)| *known == id) {
                return Err((
                    ErrorKind::Failure,
                    format!(
                        "{path} is already disk {} of pool {} (as {device}); nothing was changed",
                        index.0,
                        entry.pool.name()
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// What a disk holds that a command would overwrite.
pub enum Holds {
    /// Another format (see [`super::probe`]).
    Foreign(Signature),
    /// The label of a terrace pool that is not open here.
    OtherPool { name: String, id: String },
    /// A terrace label that cannot be read as one.
    Damaged { reason: String },
}

impl std::fmt::Display for Holds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Holds::Foreign(signature) => write!(f, "{signature}"),
            Holds::OtherPool { name, id } => write!(
                f,
                "a disk of terrace pool {name} (id {id}), which is not imported here"
            ),
            Holds::Damaged { reason } => write!(f, "a damaged terrace label ({reason})"),
        }
    }
}

/// What the disk at `path` holds, for a command on the pool `own` (its
/// id; none for `pool create`). `None` for a blank disk, for one that
/// cannot be read (its open says why), and for one with the label of
/// `own` or of a pool open here: the engine knows whether it is a
/// missing member coming back, and refuses the others, forced or not.
pub async fn what_it_holds(registry: &Registry, path: &str, own: Option<&str>) -> Option<Holds> {
    let options = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let device: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path, options).ok()?);
    match terrace_engine::scan(&[device]).await.pop()?.kind {
        DeviceKind::Blank => probe_path(path).ok().flatten().map(Holds::Foreign),
        DeviceKind::Member {
            pool_name, pool_id, ..
        } => {
            if own == Some(pool_id.as_str()) {
                return None;
            }
            for entry in registry.all() {
                if entry.pool.metadata().await.pool_id.to_string() == pool_id {
                    return None;
                }
            }
            Some(Holds::OtherPool {
                name: pool_name,
                id: pool_id,
            })
        }
        DeviceKind::Damaged { reason } => Some(Holds::Damaged { reason }),
        DeviceKind::Unreadable { .. } => None,
    }
}

/// Refuse, unless `force`, when any of `paths` holds something, naming
/// all of them; with `force`, wipe what each holds. Nothing is written
/// unless every disk passed. `own`: as in [`what_it_holds`].
pub async fn check_contents(
    registry: &Registry,
    paths: &[&str],
    own: Option<&str>,
    force: bool,
) -> Result<(), Refusal> {
    let mut holding = Vec::new();
    for &path in paths {
        if let Some(holds) = what_it_holds(registry, path, own).await {
            holding.push((path, holds));
        }
    }
    if holding.is_empty() {
        return Ok(());
    }
    if !force {
        let found: Vec<String> = holding
            .iter()
            .map(|(path, holds)| format!("{path} holds {holds}"))
            .collect();
        let (it, them) = if holding.len() == 1 {
            ("it", "it")
        } else {
            ("they", "them all")
        };
        return Err((
            ErrorKind::Failure,
            format!(
                "{}; nothing was changed. Use --force to overwrite {them} (what {it} hold{} \
                 is lost)",
                found.join("; "),
                if holding.len() == 1 { "s" } else { "" }
            ),
        ));
    }
    for (path, holds) in holding {
        let wiped = match holds {
            Holds::Foreign(_) => wipe(path),
            Holds::OtherPool { .. } | Holds::Damaged { .. } => erase_terrace_label(path),
        };
        wiped.map_err(|error| (ErrorKind::Failure, format!("cannot wipe {path}: {error}")))?;
        super::log(format!("{path}: wiped {holds} (forced)"));
    }
    Ok(())
}

/// Zero terrace's label, as `pool destroy` does: the disk is blank.
fn erase_terrace_label(path: &str) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.write_all_at(&[0u8; terrace_engine::meta::format::LABEL_BYTES], 0)?;
    file.sync_all()
}

/// Most signatures one disk is wiped of: a disk holds a few at most (a
/// file system over a stale RAID superblock); ZFS's four labels are
/// wiped at once.
const WIPE_ROUNDS_MAX: usize = 32;

/// Zero every signature found on `path`, one after the other, and sync.
fn wipe(path: &str) -> std::io::Result<()> {
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    for _ in 0..WIPE_ROUNDS_MAX {
        let Some(signature) = probe_path(path)? else {
            file.sync_all()?;
            return Ok(());
        };
        for &(offset, length) in &signature.wipe {
            file.write_all_at(&vec![0u8; length as usize], offset)?;
        }
        file.sync_all()?;
    }
    Err(std::io::Error::other(format!(
        "still holds something after wiping {WIPE_ROUNDS_MAX} signatures"
    )))
}
