//! What the admin should do: one line for each state of a pool that the
//! pool cannot leave on its own, in `pool status` ("action: ...") and as
//! `action` in its `--json` (the pool's first, each disk's and space's;
//! null when none).
//!
//! | state | action |
//! |---|---|
//! | space offline (extents lost) | reconnect its missing disks, else restore it from a backup |
//! | lost disk, retire-missing never | reconnect (missing) or replace it, or let the pool repair it |
//! | lost disk whose repair finds no room | add a disk of the size it needs (or a journal disk, for logs) |
//! | log that lost every copy | replace the failed disks that held it |
//!
//! A lost disk that a job repairs, or whose repair the policy will start,
//! needs nobody.

use terrace_engine::meta::{DiskState, RetireMissing};
use terrace_engine::{Condition, DiskStatus, PoolStatus, SpaceHealth, SpaceStatus};

use crate::units::format_size;

/// What to do about `disk` of `status`'s pool, if anything.
pub fn disk_action(status: &PoolStatus, disk: &DiskStatus) -> Option<String> {
    let lost = matches!(disk.state, DiskState::Failed | DiskState::Missing)
        || (disk.state != DiskState::Removed && disk.condition != Condition::Online);
    if !lost || disk.slabs_used == 0 || disk.job.is_some() {
        return None;
    }
    let pool = &status.name;
    let index = disk.index;
    if status.settings.retire_missing == RetireMissing::Never {
        let first = if disk.condition == Condition::Missing {
            format!("reconnect disk {index} ({}), or replace it", disk.device)
        } else {
            format!("replace disk {index} ({})", disk.device)
        };
        return Some(format!(
            "{first}: terrace disk replace {pool} {index} DEVICE; or let the pool repair it into \
             free space: terrace pool set {pool} --retire-missing auto"
        ));
    }
    let unrepaired = disk.unrepaired.as_ref()?;
    let size = format_size(unrepaired.disk_bytes);
    Some(if unrepaired.logs_only {
        format!(
            "add a disk of at least {size}, or a journal disk (terrace disk add {pool} DEVICE): \
             the write-back log copies disk {index} held find no room to be re-created"
        )
    } else {
        format!(
            "add a disk of at least {size} (terrace disk add {pool} DEVICE): what disk {index} \
             held finds no room to be re-created"
        )
    })
}

/// What to do about `space` of `status`'s pool, if anything.
pub fn space_action(status: &PoolStatus, space: &SpaceStatus) -> Option<String> {
    if let SpaceHealth::Offline { lost_extents } = space.health {
        let missing = status
            .disks
            .iter()
            .any(|d| d.state != DiskState::Removed && d.condition == Condition::Missing);
        let lost = crate::units::count(lost_extents, "extent");
        return Some(if missing {
            format!(
                "reconnect the missing disks: space {} lost {lost} with them; if they are gone, \
                 restore it from a backup",
                space.name
            )
        } else {
            format!(
                "restore space {} from a backup: {lost} lost more disks than its layout tolerates",
                space.name
            )
        });
    }
    let cache = space.cache.as_ref()?;
    cache.status.write_through.as_ref()?;
    Some(format!(
        "replace the failed disks that held the write-back log of {} (disks {}): it lost every \
         copy, and the space writes through",
        space.name,
        cache
            .log_disks
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Every action of the pool, the most urgent first: spaces that lost
/// data, then lost disks, then failed logs.
pub fn pool_actions(status: &PoolStatus) -> Vec<String> {
    let offline = |space: &&SpaceStatus| matches!(space.health, SpaceHealth::Offline { .. });
    let spaces_first = status.spaces.iter().filter(offline);
    let spaces_last = status.spaces.iter().filter(|space| !offline(space));
    let mut actions: Vec<String> = spaces_first
        .filter_map(|space| space_action(status, space))
        .collect();
    actions.extend(
        status
            .disks
            .iter()
            .filter_map(|disk| disk_action(status, disk)),
    );
    actions.extend(spaces_last.filter_map(|space| space_action(status, space)));
    actions
}
