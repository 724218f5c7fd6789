//! Engine state → the API's views.

use terrace_engine::layout::Layout;
use terrace_engine::meta::{
    DiskIndex, DiskState, FaultDomain, JobKind, JobState, Media, PoolMetadata, PoolSettings,
    RepairPolicy, RetireMissing,
};
use terrace_engine::{
    Condition, DiskStatus, JobStatus, PoolHealth, PoolStatus, SpaceHealth, SpaceStatus,
};

use crate::api::{
    non_empty, DiskView, ExtentView, ImpactView, JobView, PoolSummary, PoolView, SettingsView,
    SlotView, SpaceDetail, SpaceView,
};
use crate::units::{count, format_size};

pub fn media_name(media: Media) -> &'static str {
    match media {
        Media::Hdd => "hdd",
        Media::Ssd => "ssd",
        Media::Unknown => "unknown",
    }
}

pub fn condition_name(condition: Condition) -> &'static str {
    match condition {
        Condition::Online => "ONLINE",
        Condition::Failed => "FAILED",
        Condition::Missing => "MISSING",
        Condition::Standby => "STANDBY",
    }
}

/// A disk's state as status shows it: a disk emptied and released by
/// `disk remove` or `disk replace` keeps its row (indexes stay stable) but
/// is neither missing nor failed.
fn disk_state_name(disk: &DiskStatus) -> &'static str {
    if disk.state == DiskState::Removed {
        "REMOVED"
    } else {
        condition_name(disk.condition)
    }
}

pub fn domain_name(domain: FaultDomain) -> &'static str {
    match domain {
        FaultDomain::Disk => "disk",
        FaultDomain::Enclosure => "enclosure",
        FaultDomain::Node => "node",
    }
}

fn state_and_reason(status: &PoolStatus) -> (&'static str, String) {
    let offline = status
        .disks
        .iter()
        .filter(|d| d.state != DiskState::Removed && d.condition != Condition::Online)
        .count();
    match (&status.health, &status.read_only) {
        (PoolHealth::DataLoss, read_only) => (
            "DATA-LOSS",
            format!(
                "some extents lost more disks than their layout tolerates; their data is unavailable{}",
                // Read-only as well (a minority of disks imported, say):
                // the state names the worse, the reason both.
                read_only
                    .as_ref()
                    .map_or(String::new(), |reason| format!("; read-only: {reason}"))
            ),
        ),
        (_, Some(reason)) => ("READ-ONLY", reason.clone()),
        (PoolHealth::Degraded, None) => (
            "DEGRADED",
            format!(
                "{} failed or missing; every space still has its data",
                count(offline as u64, "disk")
            ),
        ),
        (PoolHealth::Ok, None) if offline > 0 => (
            "ONLINE",
            format!(
                "every disk holding data is online; {} failed or missing, holding none",
                count(offline as u64, "disk")
            ),
        ),
        (PoolHealth::Ok, None) => ("ONLINE", "all disks online".into()),
    }
}

pub fn summary(status: &PoolStatus) -> PoolSummary {
    let (state, reason) = state_and_reason(status);
    PoolSummary {
        name: status.name.clone(),
        id: status.id.clone(),
        state: state.into(),
        reason,
        disk_count: status
            .disks
            .iter()
            .filter(|disk| disk.state != DiskState::Removed)
            .count(),
        space_count: status.spaces.len(),
        capacity_bytes: status.capacity_bytes,
        allocated_bytes: status.allocated_bytes,
        journal_bytes: status.journal_bytes,
        journal_allocated_bytes: status.journal_allocated_bytes,
        provisioned_bytes: status.provisioned_bytes,
        overcommit_ratio: status.provisioned_bytes as f64 / status.capacity_bytes.max(1) as f64,
        thin_reserve_bytes: status.thin_reserve_bytes,
        action: super::actions::pool_actions(status).into_iter().next(),
    }
}

pub fn space_view(pool: &str, space: &SpaceStatus, read_only: bool, export: String) -> SpaceView {
    let (layout, copies, redundancy) = match space.layout {
        Layout::Simple => ("simple", 1, 0),
        Layout::Mirror { copies } => ("mirror", copies, copies - 1),
        Layout::Parity { redundancy } => ("parity", 1, redundancy),
    };
    let (health, survives, repair) = match space.health {
        SpaceHealth::Healthy => ("healthy", Some(space.failures_tolerated), None),
        SpaceHealth::NoRedundancy => ("no-redundancy", Some(0), None),
        SpaceHealth::Incomplete { survives } => ("incomplete", Some(survives), None),
        SpaceHealth::Degraded { survives } => ("degraded", Some(survives), None),
        SpaceHealth::Repairing {
            job,
            percent,
            survives,
        } => ("repairing", Some(survives), Some((job, percent))),
        SpaceHealth::Offline { .. } => ("offline", None, None),
    };
    SpaceView {
        pool: pool.to_string(),
        name: space.name.clone(),
        layout: layout.into(),
        layout_description: space.layout.to_string(),
        copies,
        redundancy,
        columns: space.columns,
        data_columns: space.data_columns,
        columns_reason: space.columns_reason.clone(),
        interleave_bytes: space.interleave_bytes,
        size_bytes: space.size_bytes,
        raw_bytes: space.raw_bytes,
        extents: space.extents,
        provisioning: provisioning_name(space.provisioning).into(),
        allocated_bytes: space.allocated_bytes,
        fault_domain: domain_name(space.fault_domain).into(),
        failures_tolerated: space.failures_tolerated,
        health: health.into(),
        survives,
        repair_job: repair.map(|(job, _)| job),
        repair_percent: repair.map(|(_, percent)| percent),
        read_only,
        export,
        export_not_served: None,
        nbd_connections: 0,
        resync_extents_left: space.resync.map_or(0, |r| r.extents_left),
        resync_extents_total: space.resync.map_or(0, |r| r.extents_total),
        resync_bytes_total: space.resync.map_or(0, |r| r.bytes_total),
        resync_bytes_done: space.resync.map_or(0, |r| r.bytes_done),
        resync_rate_bytes_per_second: space.resync.map_or(0, |r| r.rate_bytes_per_second),
        resync_eta_seconds: space.resync.and_then(|r| r.eta_seconds),
        cache: space
            .cache
            .as_ref()
            .map(|cache| cache_view(cache, space.layout)),
        action: None,
        checksums: match space.checksums {
            terrace_engine::Checksums::On => "on",
            terrace_engine::Checksums::Off => "off",
            terrace_engine::Checksums::NoRoom => "no-room",
        }
        .into(),
    }
}

/// As users write it (`--provisioning`).
pub fn provisioning_name(provisioning: terrace_engine::meta::Provisioning) -> &'static str {
    match provisioning {
        terrace_engine::meta::Provisioning::Fixed => "fixed",
        terrace_engine::meta::Provisioning::Thin => "thin",
    }
}

fn cache_view(cache: &terrace_engine::CacheInfo, layout: Layout) -> crate::api::CacheView {
    let status = &cache.status;
    let log_health = match cache.log_health {
        SpaceHealth::Healthy => "healthy",
        SpaceHealth::NoRedundancy => "no-redundancy",
        SpaceHealth::Incomplete { .. } => "incomplete",
        SpaceHealth::Degraded { .. } => "degraded",
        SpaceHealth::Repairing { .. } => "repairing",
        SpaceHealth::Offline { .. } => "offline",
    };
    let lose = cache.log_copies.saturating_sub(1);
    crate::api::CacheView {
        bytes: status.bytes,
        dirty_bytes: status.dirty_bytes,
        memory_bytes: status.memory_bytes,
        used_bytes: status.used_bytes,
        fill_percent: (status.used_bytes * 100)
            .checked_div(status.bytes)
            .map_or(0, |p| p.min(100) as u32),
        log_disks: cache.log_disks.clone(),
        log_copies: cache.log_copies,
        log_health: log_health.into(),
        placement: cache.placement.clone(),
        protects: match status.write_through {
            Some(_) => write_through_protects(layout).to_string(),
            None => format!(
                "{} copies: any {} may fail without losing a logged write; {}",
                cache.log_copies,
                count(lose, "log disk"),
                match layout {
                    Layout::Parity { .. } => "partial-stripe writes are logged before they touch the disks, so a crash leaves no write hole",
                    Layout::Mirror { .. } => "writes smaller than an interleave are logged before they touch the disks, and after a crash only the ranges being written are resynced",
                    Layout::Simple => "small writes are acknowledged once logged and reach the disks in the background",
                }
            ),
        },
        absorbed_writes: status.absorbed_writes,
        absorbed_bytes: status.absorbed_bytes,
        bypassed_writes: status.bypassed_writes,
        bypassed_bytes: status.bypassed_bytes,
        destaged_bytes: status.destaged_bytes,
        destage_rate_bytes_per_second: status.destage_rate,
        write_through: status.write_through.clone(),
    }
}

/// What protects the writes of a space whose log has failed: it writes
/// straight to the disks, as a space without a log does; the write intent
/// names the extents being written, and after a crash the next import
/// resyncs them (parity recomputed from the data, mirror copies made
/// equal). Parity from data is right only where no disk of the row is
/// missing: a crash while one is can leave the missing column of a row cut
/// mid-write undefined, the write hole the log used to close.
fn write_through_protects(layout: Layout) -> &'static str {
    match layout {
        Layout::Parity { .. } => "no log copy left: writes go straight to the disks (write-through); the write intent names the extents being written and after a crash their parity is recomputed from the data, which closes the write hole only while no disk of the space is missing: a crash while one is can leave partial-stripe writes in flight with their missing column undefined",
        Layout::Mirror { .. } => "no log copy left: writes go straight to the disks (write-through); the write intent names the extents being written and after a crash their copies are resynced",
        Layout::Simple => "no log copy left: writes go straight to the disks (write-through) and are durable once flushed or written with FUA",
    }
}

pub fn pool_view(
    status: &PoolStatus,
    jobs: &[JobStatus],
    settings: &PoolSettings,
    export_name: impl Fn(&str) -> String,
) -> PoolView {
    let disks: Vec<DiskView> = status
        .disks
        .iter()
        .map(|disk| DiskView {
            index: disk.index,
            id: disk.id.clone(),
            device: disk.device.clone(),
            state: disk_state_name(disk).into(),
            reason: super::advice::disk_reason(&disk.reason, &status.name),
            media: media_name(disk.media).into(),
            usage: disk.usage.name().into(),
            size_bytes: disk.size_bytes,
            slabs_total: disk.slabs_total,
            slabs_used: disk.slabs_used,
            enclosure: non_empty(&disk.enclosure),
            node: non_empty(&disk.node),
            latency_us: disk.latency_us,
            slow: disk.slow,
            read_errors: disk.errors.read,
            write_errors: disk.errors.write,
            checksum_errors: disk.errors.checksum,
            missed_extents: disk.missed_extents,
            unrepaired: disk.unrepaired.as_ref().map(|u| u.reason.clone()),
            action: super::actions::disk_action(status, disk),
        })
        .collect();
    let read_only = status.read_only.is_some();
    let spaces = status
        .spaces
        .iter()
        .map(|space| SpaceView {
            action: super::actions::space_action(status, space),
            ..space_view(&status.name, space, read_only, export_name(&space.name))
        })
        .collect();
    PoolView {
        summary: summary(status),
        generation: status.generation,
        slab_bytes: status.slab_bytes,
        metadata_bytes: status.metadata_bytes,
        metadata_slot_bytes: status.metadata_slot_bytes,
        metadata_reserve_bytes: status.metadata_reserve_bytes,
        read_only: status.read_only.clone(),
        settings: settings_view(settings),
        jobs: jobs
            .iter()
            .map(|job| job_view(&status.name, job, &disks))
            .collect(),
        impact: status
            .impact
            .iter()
            .map(|impact| ImpactView {
                what: impact.what.clone(),
                lose_data: impact.lose_data.clone(),
                lose_redundancy: impact.lose_redundancy.clone(),
                lose_log: impact.lose_log.clone(),
                lose_log_redundancy: impact.lose_log_redundancy.clone(),
            })
            .collect(),
        disks,
        spaces,
        log_memory_bytes: status.log_memory_bytes,
        log_memory_max_bytes: status.log_memory_max_bytes,
        preparing: status
            .preparing
            .as_ref()
            .map(|preparing| crate::api::PreparationView {
                space: preparing.space.clone(),
                total_bytes: preparing.total_bytes,
                done_bytes: preparing.done_bytes,
            }),
    }
}

pub fn settings_view(settings: &PoolSettings) -> SettingsView {
    SettingsView {
        retire_missing: match settings.retire_missing {
            RetireMissing::Never => "never",
            RetireMissing::Always => "always",
            RetireMissing::Auto => "auto",
        }
        .into(),
        repair_policy: match settings.repair_policy {
            RepairPolicy::Parallel => "parallel",
            RepairPolicy::Sequential => "sequential",
        }
        .into(),
        repair_rate_bytes_per_second: settings.repair_rate_bytes_per_second,
        scrub: super::scrub::interval_words(settings.scrub_interval_secs),
        scrub_interval_seconds: settings.scrub_interval_secs,
        scrub_last_unix_seconds: (settings.scrub_last_ns > 0)
            .then_some(settings.scrub_last_ns / 1_000_000_000),
        // A pool that never scrubbed counts from when its daemon started
        // it: not known here.
        scrub_next_unix_seconds: (settings.scrub_last_ns > 0 && settings.scrub_interval_secs > 0)
            .then_some(settings.scrub_last_ns / 1_000_000_000 + settings.scrub_interval_secs),
        error_limit: settings.error_limit,
        error_window_seconds: settings.error_window_secs,
        provisioning: provisioning_name(settings.provisioning).into(),
        alert_percents: settings
            .alert_percents
            .into_iter()
            .filter(|&percent| percent > 0)
            .collect(),
    }
}

fn disk_name(disks: &[DiskView], index: DiskIndex) -> String {
    match disks.iter().find(|d| d.index == index.0) {
        Some(disk) => format!("disk {} ({})", index.0, disk.device),
        None => format!("disk {}", index.0),
    }
}

pub fn job_view(pool: &str, job: &JobStatus, disks: &[DiskView]) -> JobView {
    let (kind, description) = match job.kind {
        JobKind::Repair { disk } => (
            "repair",
            format!("re-create the slabs of {}", disk_name(disks, disk)),
        ),
        JobKind::Evacuate { disk } => (
            "evacuate",
            format!("move everything off {}", disk_name(disks, disk)),
        ),
        JobKind::Replace { old, new } => (
            "replace",
            format!(
                "move everything of {} onto {}",
                disk_name(disks, old),
                disk_name(disks, new)
            ),
        ),
        JobKind::Resync { disk } => (
            "resync",
            format!("catch {} up on what it missed", disk_name(disks, disk)),
        ),
        JobKind::LogsToJournal => (
            "logs-to-journal",
            "move write-back logs off capacity disks onto journal disks".to_string(),
        ),
        JobKind::Scrub => (
            "scrub",
            "read every block, check its sum and redundancy, repair what is wrong".to_string(),
        ),
    };
    JobView {
        pool: pool.to_string(),
        id: job.id,
        kind: kind.into(),
        description,
        state: format!("{:?}", job.state).to_lowercase(),
        reason: super::advice::job_reason(job),
        bytes_total: job.bytes_total,
        bytes_done: job.bytes_done,
        // A job with nothing to move is done at once: 100 %; one that
        // could not start moved nothing: 0 %.
        percent: (job.bytes_done * 100).checked_div(job.bytes_total).map_or(
            if job.state == JobState::Done { 100 } else { 0 },
            |percent| percent as u32,
        ),
        rate_bytes_per_second: job.rate_bytes_per_second,
        eta_seconds: job.eta_seconds,
        moves_total: job.moves_total,
        moves_done: job.moves_done,
        nothing_to_do: job.moves_total == 0
            && job.state == terrace_engine::meta::JobState::Done
            && (job.kind != JobKind::Scrub || job.bytes_total == 0),
        repaired: (job.kind == JobKind::Scrub).then_some(job.repaired),
        unrepaired: (job.kind == JobKind::Scrub).then_some(job.unrepaired),
    }
}

fn slot_role(layout: Layout, slot: u32) -> String {
    match layout {
        Layout::Mirror { copies } => format!("column {} copy {}", slot / copies, slot % copies),
        Layout::Simple | Layout::Parity { .. } => format!("column {slot}"),
    }
}

fn explanation(view: &SpaceView, slab_bytes: u64) -> Vec<String> {
    let mut lines = vec![format!(
        "{}: {}",
        view.layout_description, view.columns_reason
    )];
    match view.layout.as_str() {
        "mirror" => lines.push(format!(
            "each row stripes {} interleave units over {}; every column is kept on {} disks",
            format_size(view.interleave_bytes),
            count(view.columns, "column"),
            view.copies
        )),
        "parity" => lines.push(format!(
            "each row holds {} data units of {} and {}; parity rotates one column per row so every disk shares the parity work",
            view.data_columns,
            format_size(view.interleave_bytes),
            count(view.redundancy, "parity unit")
        )),
        _ => lines.push(format!(
            "each row stripes {} interleave units over {}; no redundancy",
            format_size(view.interleave_bytes),
            count(view.columns, "column")
        )),
    }
    let slots = view.columns * view.copies;
    lines.push(format!(
        "an extent is {slots} slabs of {} on {slots} distinct {}s, holding up to {} of the space",
        format_size(slab_bytes),
        view.fault_domain,
        format_size(u64::from(view.data_columns) * slab_bytes)
    ));
    lines.push(format!(
        "usable {} in {} of slabs; the layout keeps {:.0}% of raw capacity for data",
        format_size(view.size_bytes),
        format_size(view.raw_bytes),
        100.0 * f64::from(view.data_columns) / f64::from(slots)
    ));
    if view.provisioning == "thin" {
        lines.push(format!(
            "thin: {} of {} allocated; an extent takes its slabs at its first write, and reads of one never written return zeroes without reading a disk",
            format_size(view.allocated_bytes),
            format_size(view.size_bytes),
        ));
    }
    lines.push(match view.survives {
        Some(n) => format!(
            "survives any {} by design; {n} more now",
            count(view.failures_tolerated, "disk failure")
        ),
        None => "some extents have lost their data".into(),
    });
    lines.push(match view.checksums.as_str() {
        "on" if view.failures_tolerated > 0 => "checksums: on; every 4K block read is checked, and one that fails is rebuilt from redundancy and rewritten".to_string(),
        "on" => "checksums: on; every 4K block read is checked, and one that fails is refused (no redundancy to rebuild it from)".to_string(),
        "off" => "checksums: off, as asked at creation: a damaged copy would be returned as it is".to_string(),
        _ => "checksums: none yet, the pool had no room for them; they are added at an import that finds room".to_string(),
    });
    lines
}

pub fn space_detail(view: SpaceView, metadata: &PoolMetadata, devices: &[DiskView]) -> SpaceDetail {
    let record = metadata.space(&view.name);
    let extent_bytes = u64::from(view.data_columns) * metadata.slab_bytes;
    let named = record
        .map(|record| metadata.intent_of(record.id))
        .unwrap_or_default();
    let whole = named.contains(&terrace_engine::meta::format::INTENT_WHOLE_SPACE);
    let extent_map = record
        .map(|record| {
            record
                .extents
                .iter()
                .enumerate()
                .map(|(index, extent)| ExtentView {
                    write_intent: whole || named.contains(&(index as u32)),
                    index: index as u64,
                    offset_bytes: index as u64 * extent_bytes,
                    length_bytes: extent_bytes,
                    slots: extent
                        .slabs
                        .iter()
                        .flatten()
                        .enumerate()
                        .map(|(slot, slab)| {
                            let disk = devices.iter().find(|d| d.index == slab.disk.0);
                            SlotView {
                                slot: slot as u32,
                                role: slot_role(record.layout, slot as u32),
                                disk: slab.disk.0,
                                device: disk.map(|d| d.device.clone()).unwrap_or_default(),
                                slab: slab.slab.0,
                                state: disk.map(|d| d.state.clone()).unwrap_or_default(),
                            }
                        })
                        .collect(),
                })
                .collect()
        })
        .unwrap_or_default();
    SpaceDetail {
        explanation: explanation(&view, metadata.slab_bytes),
        space: view,
        extent_map,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use terrace_engine::journal::CacheStatus;
    use terrace_engine::meta::SpaceId;
    use terrace_engine::CacheInfo;

    fn cache(write_through: Option<&str>, log_health: SpaceHealth) -> CacheInfo {
        CacheInfo {
            status: CacheStatus {
                bytes: 256 << 20,
                log_space: SpaceId(2),
                dirty_bytes: 0,
                memory_bytes: 0,
                used_bytes: 0,
                absorbed_writes: 0,
                absorbed_bytes: 0,
                bypassed_writes: 0,
                bypassed_bytes: 0,
                destaged_bytes: 0,
                destage_rate: 0,
                write_through: write_through.map(str::to_string),
            },
            log_disks: vec![3, 4],
            log_copies: 2,
            log_health,
            placement: String::new(),
        }
    }

    /// A working log says what losing its disks costs; a failed one says
    /// what protects the space now, not what the log no longer does.
    #[test]
    fn a_failed_log_says_what_protects_the_space_now() {
        let parity = Layout::Parity { redundancy: 1 };
        let working = cache_view(&cache(None, SpaceHealth::Healthy), parity).protects;
        assert!(
            working.starts_with("2 copies: any 1 log disk may fail")
                && working.ends_with("so a crash leaves no write hole"),
            "{working}"
        );
        let reason = "write-through: the log failed (no copy of this column could be written)";
        let failed = cache(Some(reason), SpaceHealth::Offline { lost_extents: 1 });
        let view = cache_view(&failed, parity);
        assert_eq!(view.write_through.as_deref(), Some(reason));
        assert_eq!(view.log_health, "offline");
        for (layout, now) in [
            (parity, "their parity is recomputed from the data"),
            (Layout::Mirror { copies: 2 }, "their copies are resynced"),
            (Layout::Simple, "durable once flushed"),
        ] {
            let protects = cache_view(&failed, layout).protects;
            assert!(
                protects.starts_with(
                    "no log copy left: writes go straight to the disks (write-through)"
                ) && protects.contains(now)
                    && !protects.contains("may fail")
                    && !protects.contains("logged"),
                "{layout:?}: {protects}"
            );
        }
        let protects = cache_view(&failed, parity).protects;
        assert!(
            protects.contains("write intent")
                && protects.contains("while no disk of the space is missing"),
            "{protects}"
        );
    }
}
