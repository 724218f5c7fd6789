//! Text views of the API's answers, in the `zpool status` tradition.

use comfy_table::presets::NOTHING;
use comfy_table::Table;

use crate::api::{
    CacheView, CandidateView, DiskView, ImpactView, ImportableView, JobView, PoolSummary, PoolView,
    SpaceDetail, SpaceView,
};
use crate::units::{count, format_size};

fn table(header: &[&str]) -> Table {
    let mut table = Table::new();
    table.load_style(NOTHING).set_header(header.to_vec());
    table
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|line| format!("  {}", line.trim_end()))
        .collect::<Vec<_>>()
        .join("\n")
}

pub fn space_health(space: &SpaceView) -> String {
    match (space.health.as_str(), space.survives) {
        ("healthy", Some(n)) => format!("healthy (survives {})", count(n, "failure")),
        ("no-redundancy", _) => "healthy (no redundancy)".into(),
        ("degraded", Some(n)) => format!("DEGRADED (survives {n} more)"),
        ("incomplete", Some(n)) => {
            format!("INCOMPLETE: disks missing, data intact (survives {n} more)")
        }
        ("repairing", Some(n)) => format!(
            "REPAIRING: job {} at {}% (survives {n} more)",
            space.repair_job.unwrap_or_default(),
            space.repair_percent.unwrap_or_default()
        ),
        ("offline", _) => "OFFLINE (some extents lost)".into(),
        (other, _) => other.to_string(),
    }
}

fn columns(space: &SpaceView) -> String {
    match space.layout.as_str() {
        "mirror" => format!("{} ×{}", space.columns, space.copies),
        "parity" => format!("{}+{}", space.data_columns, space.redundancy),
        _ => space.columns.to_string(),
    }
}

/// The full `pool status` text of one pool.
pub fn pool_status(pool: &PoolView) -> String {
    let summary = &pool.summary;
    let mut out = format!(
        "  pool: {}\n    id: {}\n state: {}\nstatus: {}\n  size: {} raw capacity, {} allocated, slab {}{}\n  logs: {} of {} log memory held\n  meta: {} of a {} slot, {} kept for a repair\n",
        summary.name,
        summary.id,
        summary.state,
        summary.reason,
        format_size(summary.capacity_bytes),
        format_size(summary.allocated_bytes),
        format_size(pool.slab_bytes),
        if summary.journal_bytes > 0 || summary.journal_allocated_bytes > 0 {
            format!(
                "; journal disks {}, {} of it for logs",
                format_size(summary.journal_bytes),
                format_size(summary.journal_allocated_bytes)
            )
        } else {
            String::new()
        },
        format_size(pool.log_memory_bytes),
        format_size(pool.log_memory_max_bytes),
        format_size(pool.metadata_bytes),
        format_size(pool.metadata_slot_bytes),
        format_size(pool.metadata_reserve_bytes),
    );
    if summary.thin_reserve_bytes > 0 || summary.provisioned_bytes > summary.capacity_bytes {
        out.push_str(&format!(
            "  thin: {} provisioned ({:.2} × the raw capacity); {} kept free for a repair, never given to thin spaces\n",
            format_size(summary.provisioned_bytes),
            summary.overcommit_ratio,
            format_size(summary.thin_reserve_bytes),
        ));
    }
    for action in actions(pool) {
        out.push_str(&format!("action: {action}\n"));
    }
    if let Some(preparing) = &pool.preparing {
        out.push_str(&preparation_line(preparing));
        out.push('\n');
    }
    out.push_str("\ndisks:\n");
    let mut disks = table(&[
        "#", "DEVICE", "STATE", "READ", "WRITE", "CKSUM", "MEDIA", "USAGE", "SIZE", "USED",
        "DOMAIN", "NOTE",
    ]);
    for disk in &pool.disks {
        let used = if disk.slabs_total == 0 {
            "-".to_string()
        } else {
            format!(
                "{}%",
                u64::from(disk.slabs_used) * 100 / u64::from(disk.slabs_total)
            )
        };
        let domain = match (&disk.node, &disk.enclosure) {
            (None, None) => "-".to_string(),
            (node, enclosure) => format!(
                "{}/{}",
                node.as_deref().unwrap_or_default(),
                enclosure.as_deref().unwrap_or_default()
            ),
        };
        disks.add_row(vec![
            disk.index.to_string(),
            disk.device.clone(),
            disk.state.clone(),
            disk.read_errors.to_string(),
            disk.write_errors.to_string(),
            disk.checksum_errors.to_string(),
            disk.media.clone(),
            disk.usage.clone(),
            format_size(disk.size_bytes),
            used,
            domain,
            disk_note(disk),
        ]);
    }
    out.push_str(&indent(&disks.to_string()));
    out.push_str("\n\nspaces:\n");
    if pool.spaces.is_empty() {
        out.push_str("  (none)\n");
    } else {
        out.push_str(&indent(&space_table(&pool.spaces).to_string()));
        out.push('\n');
        for space in &pool.spaces {
            if let Some(note) = &space.export_not_served {
                out.push_str(&format!("  {}: {note}\n", space.name));
            }
        }
        for space in pool
            .spaces
            .iter()
            .filter(|s| s.cache.is_some() || s.resync_extents_left > 0)
        {
            out.push_str(&format!("  {}:\n", space.name));
            let mut lines = resync_line(space);
            if space.cache.is_some() {
                lines.insert_str(0, &cache_lines(space));
            }
            out.push_str(&indent(&lines));
            out.push('\n');
        }
    }
    let active: Vec<JobView> = pool
        .jobs
        .iter()
        .filter(|job| matches!(job.state.as_str(), "running" | "paused"))
        .cloned()
        .collect();
    if !active.is_empty() {
        out.push_str("\njobs:\n");
        out.push_str(&indent(&jobs(&active)));
        out.push('\n');
    }
    out.push_str(&impact(pool));
    out.push_str(&format!(
        "\npolicy: retire-missing {}, repair {}, repair rate {}\n",
        pool.settings.retire_missing,
        pool.settings.repair_policy,
        match pool.settings.repair_rate_bytes_per_second {
            0 => "unlimited".to_string(),
            rate => format!("{}/s", format_size(rate)),
        }
    ));
    out.push_str(&scrub_schedule(&pool.settings));
    out.push_str(&match pool.settings.error_limit {
        0 => "errors: read and checksum errors never fail a disk\n".to_string(),
        limit => format!(
            "errors: a disk fails at {limit} read and checksum errors within {}\n",
            duration(u64::from(pool.settings.error_window_seconds))
        ),
    });
    if pool.settings.provisioning == "thin" {
        out.push_str("provisioning: spaces are thin unless created --provisioning fixed\n");
    }
    out.push_str(&match pool.settings.alert_percents.as_slice() {
        [] => "alerts: none on allocation\n".to_string(),
        percents => format!(
            "alerts: logged when allocation crosses {} of the capacity\n",
            percents
                .iter()
                .map(|percent| format!("{percent}%"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    });
    out
}

/// What `pool upgrade` left: the format, and each space's checksums.
pub fn upgraded(pool: &PoolView) -> String {
    let mut text = format!(
        "pool {}: metadata in the current format\n",
        pool.summary.name
    );
    for space in &pool.spaces {
        let state = match space.checksums.as_str() {
            "on" => "checksums on",
            "off" => "checksums off, as asked at creation",
            _ => "no checksums yet: the pool has no room for them (add a disk and upgrade again)",
        };
        text += &format!("  space {}: {state}\n", space.name);
    }
    text
}

/// The scrub schedule: how often, when the last started and when the
/// next is due, from now.
fn scrub_schedule(settings: &crate::api::SettingsView) -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let mut text = format!("scrub: {}", settings.scrub);
    if let Some(last) = settings.scrub_last_unix_seconds {
        text += &format!(", last started {} ago", duration(now.saturating_sub(last)));
    }
    match settings.scrub_next_unix_seconds {
        Some(next) if next > now => text += &format!(", next in {}", duration(next - now)),
        Some(_) => text += ", next due now",
        None => {}
    }
    text + "\n"
}

/// Every action of the pool, as its views carry them: spaces that lost
/// data first, then disks, then the other spaces (see `daemon::actions`).
fn actions(pool: &PoolView) -> Vec<&str> {
    let offline = |space: &&SpaceView| space.health == "offline";
    let first = pool.spaces.iter().filter(offline);
    let last = pool.spaces.iter().filter(|space| !offline(space));
    first
        .filter_map(|space| space.action.as_deref())
        .chain(pool.disks.iter().filter_map(|disk| disk.action.as_deref()))
        .chain(last.filter_map(|space| space.action.as_deref()))
        .collect()
}

/// "If X fails now": only the failures that would cost something.
fn impact(pool: &PoolView) -> String {
    let risky: Vec<&ImpactView> = pool
        .impact
        .iter()
        .filter(|i| {
            !(i.lose_data.is_empty()
                && i.lose_redundancy.is_empty()
                && i.lose_log.is_empty()
                && i.lose_log_redundancy.is_empty())
        })
        .collect();
    if risky.is_empty() {
        return "\nif any one disk fails now: every space keeps its data and some redundancy\n"
            .into();
    }
    let mut out = String::from("\nif it failed now:\n");
    for item in risky {
        let mut parts = Vec::new();
        if !item.lose_data.is_empty() {
            parts.push(format!("LOSES DATA in {}", item.lose_data.join(", ")));
        }
        if !item.lose_redundancy.is_empty() {
            parts.push(format!(
                "leaves {} with no redundancy",
                item.lose_redundancy.join(", ")
            ));
        }
        if !item.lose_log.is_empty() {
            parts.push(format!(
                "takes every copy of the write-back log of {} (writing through from then on)",
                item.lose_log.join(", ")
            ));
        }
        if !item.lose_log_redundancy.is_empty() {
            parts.push(format!(
                "leaves the write-back log of {} with one copy",
                item.lose_log_redundancy.join(", ")
            ));
        }
        out.push_str(&format!("  {}: {}\n", item.what, parts.join("; ")));
    }
    out
}

fn duration(seconds: u64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 7200 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 2 * 86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

/// A job's progress as [`crate::progress::Progress`] shows it: what,
/// percent, bytes done and state, and the rate with the time left while it
/// runs.
pub fn job_progress(job: &JobView) -> (String, u64, String, String) {
    let what = format!("job {} {}", job.id, job.kind);
    if job.nothing_to_do {
        let why = job.reason.as_deref().unwrap_or("nothing to do");
        return (what, 100, format!("{why} ({})", job.state), String::new());
    }
    let steady = format!(
        "{} of {}, {}",
        format_size(job.bytes_done),
        format_size(job.bytes_total),
        job.state
    );
    let detail = match (job.state.as_str(), job.eta_seconds) {
        ("running", Some(eta)) => format!(
            "at {}/s, about {} left",
            format_size(job.rate_bytes_per_second),
            duration(eta)
        ),
        ("running", None) => format!("at {}/s", format_size(job.rate_bytes_per_second)),
        _ => String::new(),
    };
    (what, u64::from(job.percent), steady, detail)
}

pub fn jobs(list: &[JobView]) -> String {
    if list.is_empty() {
        return "no jobs\n".into();
    }
    let mut table = table(&[
        "ID", "POOL", "KIND", "STATE", "DONE", "SIZE", "RATE", "ETA", "WHAT",
    ]);
    for job in list {
        let what = match &job.reason {
            None => job.description.clone(),
            Some(reason) => format!("{}: {reason}", job.description),
        };
        // A scrub under way says what it has repaired so far.
        let what = match (job.repaired, job.state.as_str()) {
            (Some(repaired), "running" | "paused") => format!(
                "{what} ({repaired} rows repaired, {} not repairable so far)",
                job.unrepaired.unwrap_or(0)
            ),
            _ => what,
        };
        table.add_row(vec![
            job.id.to_string(),
            job.pool.clone(),
            job.kind.clone(),
            job.state.clone(),
            if job.nothing_to_do {
                "-".into()
            } else {
                format!("{}%", job.percent)
            },
            format_size(job.bytes_total),
            // A job that ended before this daemon started has no rate
            // measured here: unknown, not zero.
            if job.rate_bytes_per_second == 0 && job.state != "running" {
                "-".into()
            } else {
                format!("{}/s", format_size(job.rate_bytes_per_second))
            },
            job.eta_seconds.map_or("-".to_string(), duration),
            what,
        ]);
    }
    format!("{table}\n")
}

fn space_table(spaces: &[SpaceView]) -> Table {
    let mut table = table(&[
        "NAME",
        "POOL",
        "LAYOUT",
        "COLUMNS",
        "INTERLEAVE",
        "SIZE",
        "ALLOCATED",
        "RAW",
        "HEALTH",
        "EXPORT",
    ]);
    for space in spaces {
        table.add_row(vec![
            space.name.clone(),
            space.pool.clone(),
            space.layout_description.clone(),
            columns(space),
            format_size(space.interleave_bytes),
            format_size(space.size_bytes),
            match space.provisioning.as_str() {
                "thin" => format!("{} (thin)", format_size(space.allocated_bytes)),
                _ => format_size(space.allocated_bytes),
            },
            format_size(space.raw_bytes),
            space_health(space),
            match space.export_not_served {
                None => space.export.clone(),
                Some(_) => format!("{} (not served)", space.export),
            },
        ]);
    }
    table
}

pub fn space_list(spaces: &[SpaceView]) -> String {
    if spaces.is_empty() {
        return "no spaces\n".into();
    }
    format!("{}\n", space_table(spaces))
}

pub fn pool_list(pools: &[PoolSummary]) -> String {
    if pools.is_empty() {
        return "no pools (create one with `terrace pool create`, or `terrace pool import`)\n"
            .into();
    }
    let mut table = table(&[
        "NAME",
        "STATE",
        "CAPACITY",
        "ALLOCATED",
        "DISKS",
        "SPACES",
        "ID",
    ]);
    for pool in pools {
        table.add_row(vec![
            pool.name.clone(),
            pool.state.clone(),
            format_size(pool.capacity_bytes),
            format_size(pool.allocated_bytes),
            pool.disk_count.to_string(),
            pool.space_count.to_string(),
            pool.id.chars().take(8).collect(),
        ]);
    }
    format!("{table}\n")
}

pub fn candidates(devices: &[CandidateView]) -> String {
    if devices.is_empty() {
        return "no devices found\n".into();
    }
    let mut table = table(&["DEVICE", "KIND", "SIZE", "STATUS", "HOLDS", "WHY NOT"]);
    for device in devices {
        // What it holds, in short: the reason says it in full.
        let holds = device
            .holds
            .as_ref()
            .map_or(String::new(), |holds| match &holds.label {
                Some(label) => format!("{} {label:?}", holds.kind),
                None => holds.kind.clone(),
            });
        table.add_row(vec![
            device.device.clone(),
            device.kind.clone(),
            format_size(device.size_bytes),
            device.status.clone(),
            holds,
            device.reason.clone().unwrap_or_default(),
        ]);
    }
    format!("{table}\n")
}

/// The NOTE of a disk in `pool status`: slow, why it is out, and what it
/// missed while away.
fn disk_note(disk: &DiskView) -> String {
    let mut notes = Vec::new();
    if disk.slow {
        notes.push(format!("SLOW: {} µs per I/O", disk.latency_us));
    }
    if let Some(reason) = &disk.reason {
        notes.push(reason.clone());
    }
    if disk.missed_extents > 0 {
        notes.push(format!(
            "{} written since it left (resynced if it returns)",
            count(disk.missed_extents, "extent")
        ));
    }
    if let Some(why) = &disk.unrepaired {
        notes.push(format!("not repaired: {why}"));
    }
    notes.join("; ")
}

pub fn importable(pools: &[ImportableView]) -> String {
    if pools.is_empty() {
        return "no pools to import on the given devices\n".into();
    }
    let mut table = table(&["NAME", "ID", "GENERATION", "DEVICES FOUND"]);
    for pool in pools {
        table.add_row(vec![
            pool.name.clone(),
            pool.id.chars().take(8).collect(),
            pool.generation.to_string(),
            pool.devices.len().to_string(),
        ]);
    }
    format!("{table}\nimport one with `terrace pool import --name NAME PATH...`\n")
}

/// "5, 6": the pool disks a cache's log lives on.
pub fn log_disks(cache: &CacheView) -> String {
    let disks: Vec<String> = cache.log_disks.iter().map(u16::to_string).collect();
    disks.join(", ")
}

/// The write-back cache of a space, in a few indented lines.
/// Where a log went and why, after its disks: ": 2 copies on capacity
/// disks, as the journal disks have no room left for 1G" (" (2 copies)"
/// for a log placed before the reason was kept).
pub fn log_placement(cache: &CacheView) -> String {
    match cache.placement.split_once(": ") {
        Some((_, why)) => format!(": {why}"),
        None => format!(" ({} copies)", cache.log_copies),
    }
}

pub fn cache_lines(space: &SpaceView) -> String {
    let Some(cache) = &space.cache else {
        return "  write-back cache: none (writes go straight to the disks)\n".to_string();
    };
    let mut out = format!(
        "  write-back cache: {} ({}% used, {} dirty, {} held in memory), log on disks {} ({} copies, {})\n",
        format_size(cache.bytes),
        cache.fill_percent,
        format_size(cache.dirty_bytes),
        format_size(cache.memory_bytes),
        log_disks(cache),
        cache.log_copies,
        cache.log_health,
    );
    out.push_str(&format!(
        "    absorbed {} writes ({}), bypassed {} ({}), destaged {} (now {}/s)\n    {}\n",
        cache.absorbed_writes,
        format_size(cache.absorbed_bytes),
        cache.bypassed_writes,
        format_size(cache.bypassed_bytes),
        format_size(cache.destaged_bytes),
        format_size(cache.destage_rate_bytes_per_second),
        cache.protects,
    ));
    if let Some((_, why)) = cache.placement.split_once(": ") {
        out.push_str(&format!("    log: {why}\n"));
    }
    if let Some(reason) = &cache.write_through {
        out.push_str(&format!("    {reason}\n"));
    }
    out
}

/// What is left of a mirror's resync after an unclean shutdown, if any.
pub fn resync_line(space: &SpaceView) -> String {
    if space.resync_extents_left == 0 {
        return String::new();
    }
    let percent = (space.resync_bytes_done * 100)
        .checked_div(space.resync_bytes_total)
        .unwrap_or(0);
    let pace = match space.resync_eta_seconds {
        Some(eta) => format!(
            " at {}/s, {} left",
            format_size(space.resync_rate_bytes_per_second),
            duration(eta)
        ),
        None => String::new(),
    };
    format!(
        "  resync after an unclean shutdown: {percent}% done ({} of {} left){pace}; a row is resynchronised before it is first read\n",
        space.resync_extents_left,
        count(space.resync_extents_total, "extent"),
    )
}

/// Which extents of a space the write intent names, if it keeps one (a
/// redundant space without a log) or names any (a log that failed).
fn intent_line(detail: &SpaceDetail) -> String {
    let space = &detail.space;
    let named: Vec<String> = detail
        .extent_map
        .iter()
        .filter(|extent| extent.write_intent)
        .map(|extent| extent.index.to_string())
        .collect();
    if named.is_empty() {
        let redundant = space.copies > 1 || space.redundancy > 0;
        return if redundant && space.cache.is_none() {
            "  write intent: no extent named; a crash now resynchronises nothing\n".into()
        } else {
            String::new()
        };
    }
    if named.len() == detail.extent_map.len() {
        return format!(
            "  write intent: every extent named ({}); a crash now resynchronises the whole space\n",
            named.len()
        );
    }
    const SHOWN: usize = 8;
    let mut list = named[..named.len().min(SHOWN)].join(", ");
    if named.len() > SHOWN {
        list.push_str(&format!(" and {} more", named.len() - SHOWN));
    }
    format!(
        "  write intent: {} of {} named ({list}); a crash now resynchronises only those\n",
        count(named.len() as u64, "extent"),
        detail.extent_map.len(),
    )
}

pub fn space_detail(detail: &SpaceDetail) -> String {
    let space = &detail.space;
    let clients = match space.nbd_connections {
        0 => String::new(),
        n => format!(" ({} open)", count(n, "NBD connection")),
    };
    let mut out = format!(
        "space {} (pool {}): {}, export {}{clients}\n  health: {}\n",
        space.name,
        space.pool,
        format_size(space.size_bytes),
        space.export,
        space_health(space)
    );
    if let Some(note) = &space.export_not_served {
        out.push_str(&format!("  {note}\n"));
    }
    for line in &detail.explanation {
        out.push_str(&format!("  {line}\n"));
    }
    out.push_str(&cache_lines(space));
    out.push_str(&resync_line(space));
    out.push_str(&intent_line(detail));
    out.push_str("\nextents:\n");
    let mut table = table(&[
        "EXTENT", "OFFSET", "SLOT", "ROLE", "DISK", "DEVICE", "SLAB", "STATE",
    ]);
    for extent in &detail.extent_map {
        for slot in &extent.slots {
            let first = slot.slot == 0;
            table.add_row(vec![
                if first {
                    extent.index.to_string()
                } else {
                    String::new()
                },
                if first {
                    format_size(extent.offset_bytes)
                } else {
                    String::new()
                },
                slot.slot.to_string(),
                slot.role.clone(),
                slot.disk.to_string(),
                slot.device.clone(),
                slot.slab.to_string(),
                slot.state.clone(),
            ]);
        }
    }
    out.push_str(&indent(&table.to_string()));
    out.push('\n');
    out
}

/// `prep: the write-back log of space s, 1.2G of 8G written (15%)`.
/// A log being prepared as [`crate::progress::Progress`] shows it: what,
/// percent, bytes written.
pub fn preparation_progress(preparing: &crate::api::PreparationView) -> (String, u64, String) {
    (
        format!("prep: the write-back log of space {}", preparing.space),
        preparing.done_bytes * 100 / preparing.total_bytes.max(1),
        format!(
            "{} of {} written",
            format_size(preparing.done_bytes),
            format_size(preparing.total_bytes)
        ),
    )
}

pub fn preparation_line(preparing: &crate::api::PreparationView) -> String {
    let percent = preparing.done_bytes * 100 / preparing.total_bytes.max(1);
    format!(
        "  prep: the write-back log of space {}, {} of {} written ({percent}%)",
        preparing.space,
        format_size(preparing.done_bytes),
        format_size(preparing.total_bytes),
    )
}

/// `space verify`: the counts, then each row found disagreeing, with what
/// disagrees and where.
pub fn verify(result: &serde_json::Value) -> String {
    let unsynced = match result["unsynced_rows"].as_u64().unwrap_or(0) {
        0 => String::new(),
        n => format!(
            "; {n} not checked yet: an unclean shutdown left them to resynchronise, which is under way"
        ),
    };
    let mut text = format!(
        "space {}: {} rows checked, {} mismatched, {} skipped (a needed disk is offline, or still being caught up or rebuilt){unsynced}\n",
        result["space"].as_str().unwrap_or_default(),
        result["rows"],
        result["mismatched_rows"],
        result["skipped_rows"],
    );
    for finding in result["findings"].as_array().into_iter().flatten() {
        text += &format!(
            "row {} of extent {} (space offset {}, {} bytes):\n",
            finding["row"], finding["extent"], finding["offset"], finding["length"]
        );
        for problem in finding["problems"].as_array().into_iter().flatten() {
            text += &format!("  {}:\n", problem["what"].as_str().unwrap_or_default());
            for place in problem["places"].as_array().into_iter().flatten() {
                let role = place["role"].as_str().unwrap_or_default();
                text += &match (place["disk"].as_u64(), place["disk_offset"].as_u64()) {
                    (Some(disk), Some(offset)) => format!(
                        "    {role} (slot {}): disk {disk} {} at byte {offset}\n",
                        place["slot"],
                        place["device"].as_str().unwrap_or_default()
                    ),
                    _ => format!("    {role} (slot {}): not readable now\n", place["slot"]),
                };
            }
        }
    }
    if let Some(more) = result["findings_more"].as_u64().filter(|&more| more > 0) {
        text += &format!("... and {more} more rows that disagree\n");
    }
    text
}

/// `pool clear`: per disk, taken back or why not, and per space what it
/// missed; then every space's health.
pub fn cleared(result: &serde_json::Value) -> String {
    let pool = result["pool"].as_str().unwrap_or_default();
    let disks = result["disks"].as_array().cloned().unwrap_or_default();
    if disks.is_empty() {
        return format!(
            "pool {pool}: error counters set to zero; no failed or stale disk is present to take back\n"
        );
    }
    let mut text = String::new();
    for disk in &disks {
        let head = format!(
            "disk {} ({}, {})",
            disk["disk"],
            disk["path"].as_str().unwrap_or_default(),
            disk["was"].as_str().unwrap_or_default()
        );
        match disk["refused"].as_str() {
            Some(why) => text += &format!("{head}: not taken back: {why}\n"),
            None => {
                text += &format!("{head}: taken back\n");
                for space in disk["spaces"].as_array().into_iter().flatten() {
                    text += &format!(
                        "  space {}: {}\n",
                        space["space"].as_str().unwrap_or_default(),
                        space["note"].as_str().unwrap_or_default()
                    );
                }
            }
        }
    }
    for space in result["spaces"].as_array().into_iter().flatten() {
        text += &format!(
            "space {}: {}\n",
            space["space"].as_str().unwrap_or_default(),
            space["health"].as_str().unwrap_or_default()
        );
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_being_prepared_shows_what_is_written() {
        let line = preparation_line(&crate::api::PreparationView {
            space: "vm".into(),
            total_bytes: 8 << 30,
            done_bytes: 2 << 30,
        });
        assert_eq!(
            line,
            "  prep: the write-back log of space vm, 2G of 8G written (25%)"
        );
    }

    /// A mirror's resync after an unclean shutdown shows its share done
    /// and, once it has a rate, its pace; none shows nothing.
    #[test]
    fn a_resync_after_an_unclean_shutdown_shows_its_progress() {
        let mut space: SpaceView = serde_json::from_value(serde_json::json!({
            "pool": "tank", "name": "m", "layout": "mirror",
            "layout_description": "2-way mirror", "copies": 2, "redundancy": 1,
            "columns": 1, "data_columns": 1, "columns_reason": "", "interleave_bytes": 262144,
            "size_bytes": 4u64 << 30, "raw_bytes": 8u64 << 30, "extents": 16,
            "fault_domain": "disk", "failures_tolerated": 1, "health": "healthy",
            "repair_job": null, "repair_percent": null, "survives": 1,
            "read_only": false, "export": "m"
        }))
        .expect("a space view");
        assert_eq!(resync_line(&space), "");
        space.resync_extents_left = 12;
        space.resync_extents_total = 16;
        space.resync_bytes_total = 4 << 30;
        space.resync_bytes_done = 1 << 30;
        assert_eq!(
            resync_line(&space),
            "  resync after an unclean shutdown: 25% done (12 of 16 extents left); a row is resynchronised before it is first read\n"
        );
        space.resync_rate_bytes_per_second = 128 << 20;
        space.resync_eta_seconds = Some(24);
        assert!(
            resync_line(&space).contains("25% done (12 of 16 extents left) at 128M/s, 24s left;"),
            "{}",
            resync_line(&space)
        );
    }

    /// A job that ended with no rate measured in this daemon shows none;
    /// one that ran here, or runs, shows its rate.
    #[test]
    fn job_rates_unknown_are_not_zero() {
        let job = |state: &str, rate: u64| JobView {
            pool: "tank".into(),
            id: 1,
            kind: "repair".into(),
            description: "re-create the slabs of disk 3".into(),
            state: state.into(),
            reason: None,
            bytes_total: 512 << 20,
            bytes_done: 512 << 20,
            percent: 100,
            rate_bytes_per_second: rate,
            eta_seconds: None,
            moves_total: 2,
            moves_done: 2,
            nothing_to_do: false,
            repaired: None,
            unrepaired: None,
        };
        let rate_column = |view: JobView| {
            let table = jobs(&[view]);
            let row = table.lines().nth(1).expect("a row").to_string();
            row.split_whitespace()
                .nth(6)
                .expect("the RATE column")
                .to_string()
        };
        assert_eq!(rate_column(job("done", 0)), "-");
        assert_eq!(rate_column(job("done", 175 << 20)), "175M/s");
        assert_eq!(rate_column(job("running", 0)), "0/s");
    }
}
