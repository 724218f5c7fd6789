//! `pool clear`: take back disks whose failure has passed, and say per
//! space what each missed and what (if anything) is uncertain.

use serde::Serialize;
use terrace_engine::meta::{DiskIndex, DiskState};
use terrace_engine::{DiskCleared, EngineError};

use super::control::{disk_index, failure, find_pool, usage, value, Answer};
use super::registry::Registry;
use super::views;

#[derive(Debug, Serialize)]
struct ClearAnswer {
    pool: String,
    disks: Vec<ClearedView>,
    /// Disks looked at that still fail (or were refused): the command
    /// exits 1 when there are any.
    still_failing: usize,
    /// Every space of the pool and its health after the clear.
    spaces: Vec<SpaceHealthView>,
}

#[derive(Debug, Serialize)]
struct ClearedView {
    disk: u16,
    path: String,
    /// `failed` or `missing`: what the pool had it as.
    was: &'static str,
    taken_back: bool,
    /// Why it stays out of service; null when taken back.
    refused: Option<String>,
    /// The resync job that catches it up; null when refused.
    job: Option<u64>,
    spaces: Vec<CatchUpView>,
}

#[derive(Debug, Serialize)]
struct CatchUpView {
    space: String,
    missed_extents: u64,
    uncertain_extents: Vec<u32>,
    /// The same in words.
    note: String,
}

#[derive(Debug, Serialize)]
struct SpaceHealthView {
    space: String,
    health: String,
}

pub async fn pool_clear(registry: &Registry, pool: &str, disk: Option<String>) -> Answer {
    let _admin = registry.admin.lock().await;
    let entry = find_pool(registry, pool)?;
    let only = match disk {
        Some(disk) => Some(disk_index(&entry, pool, &disk).await?),
        None => None,
    };
    let cleared = entry.pool.clear(only).await.map_err(|error| match error {
        EngineError::NotCleared { .. } | EngineError::NoSuchDisk { .. } => usage(error),
        other => failure(other),
    })?;
    let status = entry.pool.status().await;
    let spaces = status
        .spaces
        .iter()
        .map(|space| SpaceHealthView {
            space: space.name.clone(),
            health: views::space_view(pool, space, false, String::new()).health,
        })
        .collect();
    let disks: Vec<ClearedView> = cleared.iter().map(cleared_view).collect();
    value(ClearAnswer {
        pool: pool.to_string(),
        still_failing: disks.iter().filter(|disk| !disk.taken_back).count(),
        disks,
        spaces,
    })
}

fn cleared_view(cleared: &DiskCleared) -> ClearedView {
    let DiskIndex(index) = cleared.disk;
    let (was, left) = match cleared.was {
        DiskState::Failed => ("failed", "failed"),
        _ => ("missing", "left"),
    };
    let spaces = cleared
        .spaces
        .iter()
        .map(|space| {
            let mut note = match space.missed_extents {
                0 => format!("nothing was written since disk {index} {left}"),
                n => format!(
                    "{n} extent{} written since disk {index} {left}: resynchronised from the \
                     space's other disks{}",
                    if n == 1 { "" } else { "s" },
                    cleared
                        .job
                        .map_or(String::new(), |job| format!(" (job {job})"))
                ),
            };
            if !space.uncertain_extents.is_empty() {
                let extents: Vec<String> =
                    space.uncertain_extents.iter().map(u32::to_string).collect();
                note += &format!(
                    "; uncertain: extent{} {} had a write in flight when disk {index} failed, \
                     which never completed (not acknowledged): it is taken as it is on disk \
                     {index}, where that write's blocks hold old or new data (for parity, the \
                     rest of their rows may be wrong too)",
                    if extents.len() == 1 { "" } else { "s" },
                    extents.join(", ")
                );
            }
            CatchUpView {
                space: space.space.clone(),
                missed_extents: space.missed_extents,
                uncertain_extents: space.uncertain_extents.clone(),
                note,
            }
        })
        .collect();
    ClearedView {
        disk: index,
        path: cleared.path.clone(),
        was,
        taken_back: cleared.refused.is_none(),
        refused: cleared.refused.clone(),
        job: cleared.job,
        spaces,
    }
}
