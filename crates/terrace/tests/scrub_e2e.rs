//! Scrub through the daemon: `space verify` exits 0 on a clean mirror and
//! 1, naming the place, on one whose copy was overwritten in its backing
//! file; `pool scrub` repairs that copy and `job list --json` shows the
//! job done with its counts; the daemon's log tells the finding;
//! `pool set --scrub` sets the schedule `pool status` shows.

mod common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::nbd::Connection;
use common::{random_bytes, wait_for, Daemon, GIB, MIB};
use serde_json::Value;
use terrace_engine::meta::format::data_offset;

/// The row damaged, within extent 0.
const ROW: u64 = 3;
const DAY_SECS: u64 = 24 * 3600;

/// Overwrite `ROW` of copy 1 of extent 0 of space `m` in its backing file;
/// the device and the byte offset.
fn overwrite_copy(daemon: &Daemon) -> (String, u64) {
    let detail = daemon.cli_json(&["space", "show", "m"]);
    let slot = &detail["extent_map"][0]["slots"][1];
    let device = slot["device"].as_str().expect("device").to_string();
    let pool = daemon.pool_status("tank");
    let slab_bytes = pool["slab_bytes"].as_u64().expect("slab bytes");
    let interleave = detail["space"]["interleave_bytes"]
        .as_u64()
        .expect("interleave");
    let offset = data_offset(pool["metadata_slot_bytes"].as_u64().expect("slot bytes"))
        + slot["slab"].as_u64().expect("slab") * slab_bytes
        + ROW * interleave;
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&device)
        .expect("backing file");
    file.write_all_at(&vec![0xee; interleave as usize], offset)
        .expect("overwrite");
    file.sync_all().expect("sync");
    (device, offset)
}

/// A job of `job list --json` by id, once it is no longer running.
fn finished(daemon: &Daemon, id: u64) -> Value {
    wait_for("the scrub to end", Duration::from_secs(60), || {
        let jobs = daemon.cli_json(&["job", "list"]);
        let job = jobs
            .as_array()
            .expect("jobs")
            .iter()
            .find(|job| job["id"] == id)
            .cloned()
            .expect("the job is listed");
        (job["state"] != "running").then_some(job)
    })
}

#[test]
fn verify_and_scrub_find_a_mirror_copy_overwritten_and_scrub_repairs_it() {
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("scrub", 2, GIB);
    daemon.create_pool("tank", &disks, "16M");
    daemon.create_space("tank", "m", &["--layout", "mirror", "--cache", "0"], "64M");
    let data = random_bytes(3, (16 * MIB) as usize);
    let mut connection = Connection::open(&daemon.nbd_socket, "m");
    for (index, piece) in data.chunks(MIB as usize).enumerate() {
        connection
            .write(index as u64 * MIB, piece, 0)
            .expect("write");
    }
    connection.flush().expect("flush");
    connection.disconnect();

    let clean = daemon.cli(&["space", "verify", "m"]);
    assert_eq!(clean.code(), Some(0), "{}", clean.describe());

    let (device, offset) = overwrite_copy(&daemon);
    let found = daemon.cli(&["--json", "space", "verify", "m"]);
    assert_eq!(found.code(), Some(1), "{}", found.describe());
    let report = found.json();
    assert_eq!(report["mismatched_rows"], 1, "{report}");
    let problem = &report["findings"][0]["problems"][0];
    // The copy's blocks fail their sums: the damaged copy alone is named.
    assert_eq!(problem["kind"], "checksum", "{report}");
    assert_eq!(problem["damaged_found"], true, "{report}");
    let place = problem["places"]
        .as_array()
        .expect("places")
        .iter()
        .find(|place| place["slot"] == 1)
        .unwrap_or_else(|| panic!("slot 1 not named: {report}"));
    assert_eq!(
        (place["device"].as_str(), place["disk_offset"].as_u64()),
        (Some(device.as_str()), Some(offset)),
        "{report}"
    );

    let started = daemon.cli_json(&["pool", "scrub", "tank"]);
    assert_eq!(started["kind"], "scrub", "{started}");
    let id = started["id"].as_u64().expect("job id");
    let job = finished(&daemon, id);
    assert_eq!(job["state"], "done", "{job}");
    assert_eq!(
        (&job["repaired"], &job["unrepaired"]),
        (&1.into(), &0.into())
    );
    assert_eq!(job["bytes_done"], job["bytes_total"], "{job}");
    assert!(job["bytes_total"].as_u64().unwrap() > 0, "{job}");
    assert_eq!(job["nothing_to_do"], false, "{job}");
    assert!(
        job["reason"]
            .as_str()
            .is_some_and(|reason| reason.contains("1 rows repaired, 0 could not be repaired")),
        "{job}"
    );
    let text = daemon.cli_ok(&["job", "list"]).stdout;
    assert!(text.contains("1 rows repaired"), "{text}");

    let again = daemon.cli(&["space", "verify", "m"]);
    assert_eq!(again.code(), Some(0), "{}", again.describe());
    let log = daemon.log_text();
    assert!(
        log.contains(&format!("scrub (job {id}) found space m at offset"))
            && log.contains("blocks fail their checksums")
            && log.contains(": repaired"),
        "{}",
        daemon.log_tail()
    );
    daemon.stop();
}

#[test]
fn pool_set_sets_the_scrub_schedule_and_error_limit_that_pool_status_shows() {
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("schedule", 2, GIB);
    daemon.create_pool("tank", &disks, "16M");
    let settings = &daemon.pool_status("tank")["settings"];
    assert_eq!(settings["scrub"], "monthly (every 28 days)", "{settings}");
    assert!(settings["scrub_last_unix_seconds"].is_u64(), "{settings}");

    let set = daemon.cli_json(&["pool", "set", "tank", "--scrub", "daily"]);
    let settings = &set["settings"];
    assert_eq!(settings["scrub"], "daily", "{settings}");
    assert_eq!(settings["scrub_interval_seconds"], DAY_SECS, "{settings}");
    let last = settings["scrub_last_unix_seconds"].as_u64().expect("last");
    assert_eq!(settings["scrub_next_unix_seconds"], last + DAY_SECS);
    let text = daemon.cli_ok(&["pool", "status", "tank"]).stdout;
    assert!(text.contains("scrub: daily, last started"), "{text}");

    let off = daemon.cli_json(&["pool", "set", "tank", "--scrub", "off"]);
    assert_eq!(off["settings"]["scrub"], "off", "{off}");
    assert!(
        off["settings"]["scrub_next_unix_seconds"].is_null(),
        "{off}"
    );
    let every = daemon.cli_json(&["pool", "set", "tank", "--scrub", "36h"]);
    assert_eq!(every["settings"]["scrub"], "every 36 hours", "{every}");

    let bad = daemon.cli(&["pool", "set", "tank", "--scrub", "5m"]);
    assert_eq!(bad.code(), Some(2), "{}", bad.describe());
    assert!(bad.stderr.contains("at least 1h"), "{}", bad.describe());
    let kept = &daemon.pool_status("tank")["settings"];
    assert_eq!(kept["scrub_interval_seconds"], 36 * 3600, "{kept}");

    // The error limit is a setting beside it, and the disks show their
    // counters as columns.
    assert_eq!(kept["error_limit"], 10, "{kept}");
    assert_eq!(kept["error_window_seconds"], 600, "{kept}");
    let set = daemon.cli_json(&[
        "pool",
        "set",
        "tank",
        "--error-limit",
        "3",
        "--error-window",
        "1h",
    ]);
    assert_eq!(set["settings"]["error_limit"], 3, "{set}");
    assert_eq!(set["settings"]["error_window_seconds"], 3600, "{set}");
    let text = daemon.cli_ok(&["pool", "status", "tank"]).stdout;
    assert!(
        text.contains("a disk fails at 3 read and checksum errors within 60m00s"),
        "{text}"
    );
    assert!(text.contains("READ") && text.contains("CKSUM"), "{text}");
    let disk = &daemon.pool_status("tank")["disks"][0];
    assert_eq!(disk["read_errors"], 0, "{disk}");
    let bad = daemon.cli(&["pool", "set", "tank", "--error-window", "soon"]);
    assert_eq!(bad.code(), Some(2), "{}", bad.describe());
    let cleared = daemon.cli_ok(&["pool", "clear", "tank"]).stdout;
    assert!(cleared.contains("error counters set to zero"), "{cleared}");

    // A pool already current: an upgrade changes nothing and says what
    // each space keeps.
    daemon.create_space("tank", "on", &["--layout", "mirror"], "16M");
    daemon.create_space(
        "tank",
        "off",
        &["--layout", "simple", "--checksums", "off"],
        "16M",
    );
    let upgraded = daemon.cli_ok(&["pool", "upgrade", "tank"]).stdout;
    assert!(
        upgraded.contains("metadata in the current format")
            && upgraded.contains("space on: checksums on")
            && upgraded.contains("space off: checksums off, as asked"),
        "{upgraded}"
    );
    daemon.stop();
}

/// A scrub killed with the daemon (SIGKILL) goes on after the restart from
/// the cursor it last committed: copies damaged while the daemon was down
/// are repaired past it and left before it (`space verify` still finds
/// those), never all of them as a scrub starting over would.
#[test]
fn a_scrub_killed_with_the_daemon_resumes_from_its_cursor() {
    const EXTENTS: u64 = 16;
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("killed", 2, GIB);
    daemon.create_pool("tank", &disks, "1M");
    daemon.create_space("tank", "m", &["--layout", "mirror", "--cache", "0"], "16M");
    let detail = daemon.cli_json(&["space", "show", "m"]);
    let pool = daemon.pool_status("tank");
    let slab_bytes = pool["slab_bytes"].as_u64().expect("slab bytes");
    let start = data_offset(pool["metadata_slot_bytes"].as_u64().expect("slot bytes"));
    let copies: Vec<(String, u64)> = (0..EXTENTS as usize)
        .map(|extent| {
            let slot = &detail["extent_map"][extent]["slots"][1];
            let device = slot["device"].as_str().expect("device").to_string();
            (
                device,
                start + slot["slab"].as_u64().expect("slab") * slab_bytes,
            )
        })
        .collect();
    assert_eq!(copies.len() as u64, EXTENTS);

    // Two extents' slabs (2M read) a second: the cursor commits as it goes.
    let started = daemon.cli_json(&["pool", "scrub", "tank", "--rate", "1M"]);
    let id = started["id"].as_u64().expect("job id");
    wait_for("three extents scrubbed", Duration::from_secs(60), || {
        let jobs = daemon.cli_json(&["job", "list"]);
        let job = jobs.as_array()?.iter().find(|job| job["id"] == id)?.clone();
        (job["bytes_done"].as_u64()? >= 3 * 2 * slab_bytes).then_some(())
    });
    daemon.kill();
    for (device, offset) in &copies {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(device)
            .expect("backing file");
        file.write_all_at(&[0xee; 4096], *offset)
            .expect("overwrite");
        file.sync_all().expect("sync");
    }
    daemon.restart();
    let job = finished(&daemon, id);
    assert_eq!(job["state"], "done", "{job}");
    let repaired = job["repaired"].as_u64().expect("repaired");
    assert!(repaired > 0 && repaired < EXTENTS, "{job}");
    let left = daemon.cli(&["--json", "space", "verify", "m"]);
    assert_eq!(left.code(), Some(1), "{}", left.describe());
    assert_eq!(left.json()["mismatched_rows"], EXTENTS - repaired);
    daemon.stop();
}
