//! Human-readable views of pool state, in the `zpool status` tradition.

use comfy_table::presets::NOTHING;
use comfy_table::{CellAlignment, Table};
use terrace_engine::layout::Layout;
use terrace_engine::meta::{Media, Usage};
use terrace_engine::{Condition, PoolHealth, PoolStatus, SpaceHealth, SpaceStatus};

use crate::units::format_size;

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(NOTHING).set_header(header.to_vec());
    table
}

pub fn pool_health(status: &PoolStatus) -> (&'static str, String) {
    let offline = status
        .disks
        .iter()
        .filter(|d| d.condition != Condition::Online)
        .count();
    match (&status.health, &status.read_only) {
        (PoolHealth::DataLoss, _) => (
            "DATA-LOSS",
            "some extents lost more disks than their layout tolerates; their data is unavailable"
                .into(),
        ),
        (_, Some(reason)) => ("READ-ONLY", reason.clone()),
        (PoolHealth::Degraded, None) => (
            "DEGRADED",
            format!("{offline} disk(s) failed or missing; every space still has its data"),
        ),
        (PoolHealth::Ok, None) => ("ONLINE", "all disks online".into()),
    }
}

fn condition(condition: Condition) -> &'static str {
    match condition {
        Condition::Online => "ONLINE",
        Condition::Failed => "FAILED",
        Condition::Missing => "MISSING",
        Condition::Standby => "STANDBY",
    }
}

fn media(media: Media) -> &'static str {
    match media {
        Media::Hdd => "hdd",
        Media::Ssd => "ssd",
        Media::Unknown => "-",
    }
}

fn usage(usage: Usage) -> &'static str {
    match usage {
        Usage::Auto => "auto",
        Usage::Manual => "manual",
        Usage::HotSpare => "hot-spare",
        Usage::Journal => "journal",
        Usage::Retired => "retired",
    }
}

pub fn layout(layout: Layout) -> String {
    layout.to_string()
}

pub fn space_health(status: &SpaceStatus) -> String {
    match status.health {
        SpaceHealth::Healthy => format!(
            "healthy (survives {} failure(s))",
            status.failures_tolerated
        ),
        SpaceHealth::NoRedundancy => "healthy (no redundancy)".into(),
        SpaceHealth::Degraded { survives } => format!("DEGRADED (survives {survives} more)"),
        SpaceHealth::Offline { lost_extents } => format!("OFFLINE ({lost_extents} extent(s) lost)"),
    }
}

fn columns(status: &SpaceStatus) -> String {
    match status.layout {
        Layout::Mirror { copies } => format!("{} ×{copies}", status.columns),
        Layout::Parity { redundancy } => format!("{}+{redundancy}", status.data_columns),
        Layout::Simple => status.columns.to_string(),
    }
}

/// The full `pool status` text.
pub fn pool_status(status: &PoolStatus) -> String {
    let (state, why) = pool_health(status);
    let mut out = String::new();
    out.push_str(&format!(
        "  pool: {}\n    id: {}\n state: {state}\nstatus: {why}\n",
        status.name, status.id
    ));
    out.push_str(&format!(
        "  size: {} raw capacity, {} allocated, slab {}\n\ndisks:\n",
        format_size(status.capacity_bytes),
        format_size(status.allocated_bytes),
        format_size(status.slab_bytes)
    ));
    let mut disks = table(&[
        "#", "DEVICE", "STATE", "MEDIA", "USAGE", "SIZE", "USED", "DOMAIN", "NOTE",
    ]);
    for disk in &status.disks {
        let used = if disk.slabs_total == 0 {
            "-".to_string()
        } else {
            format!(
                "{}%",
                u64::from(disk.slabs_used) * 100 / u64::from(disk.slabs_total)
            )
        };
        let domain = match (disk.node.as_str(), disk.enclosure.as_str()) {
            ("", "") => "-".to_string(),
            (node, enclosure) => format!("{node}/{enclosure}"),
        };
        disks.add_row(vec![
            disk.index.to_string(),
            disk.device.clone(),
            condition(disk.condition).to_string(),
            media(disk.media).to_string(),
            usage(disk.usage).to_string(),
            format_size(disk.size_bytes),
            used,
            domain,
            disk.reason.clone(),
        ]);
    }
    out.push_str(&indent(&disks.to_string()));
    out.push_str("\n\nspaces:\n");
    let mut spaces = table(&[
        "NAME",
        "LAYOUT",
        "COLUMNS",
        "INTERLEAVE",
        "SIZE",
        "RAW",
        "HEALTH",
    ]);
    for space in &status.spaces {
        spaces.add_row(vec![
            space.name.clone(),
            layout(space.layout),
            columns(space),
            format_size(space.interleave_bytes),
            format_size(space.size_bytes),
            format_size(space.raw_bytes),
            space_health(space),
        ]);
    }
    if status.spaces.is_empty() {
        out.push_str("  (none)\n");
    } else {
        if let Some(column) = spaces.column_mut(4) {
            column.set_cell_alignment(CellAlignment::Right);
        }
        out.push_str(&indent(&spaces.to_string()));
        out.push('\n');
    }
    out
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("  {}", line.trim_end()))
        .collect::<Vec<_>>()
        .join("\n")
}
