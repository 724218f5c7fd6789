//! `space verify` through the daemon: a clean space exits 0; a parity
//! space (with its default write-back log) whose data column was
//! overwritten in its backing file, behind the daemon, exits 1 and names
//! the row, the extent, and (by the blocks' checksums) the damaged slot
//! alone with its disk and the byte offset on it, in text and in `--json`.

mod common;

use std::os::unix::fs::FileExt;

use common::nbd::Connection;
use common::{random_bytes, Daemon, GIB, MIB};
use terrace_engine::meta::format::data_offset;

/// The row damaged, within extent 0.
const ROW: u64 = 1;

#[test]
fn space_verify_finds_a_column_overwritten_in_a_backing_file_and_names_it() {
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("verify", 4, GIB);
    daemon.create_pool("verify", &disks, "16M");
    let parity = ["--layout", "parity", "--redundancy", "1"];
    let created = daemon.create_space("verify", "p", &parity, "64M");
    assert!(
        !created["cache"].is_null(),
        "a parity space has a log: {created}"
    );
    let data = random_bytes(1, (16 * MIB) as usize);
    let mut connection = Connection::open(&daemon.nbd_socket, "p");
    for (index, piece) in data.chunks(MIB as usize).enumerate() {
        connection
            .write(index as u64 * MIB, piece, 0)
            .expect("write");
    }
    connection.flush().expect("flush");
    connection.disconnect();

    let clean = daemon.cli_json(&["space", "verify", "p"]);
    assert_eq!(clean["mismatched_rows"], 0, "{clean}");
    assert_eq!(clean["findings"], serde_json::json!([]), "{clean}");
    assert_eq!(clean["findings_more"], 0, "{clean}");
    assert!(clean["rows"].as_u64().unwrap() > 0, "{clean}");

    // Slot 0 of extent 0: where its slab lies in its backing file.
    let detail = daemon.cli_json(&["space", "show", "p"]);
    let slot = &detail["extent_map"][0]["slots"][0];
    let device = slot["device"].as_str().expect("device").to_string();
    let disk = slot["disk"].as_u64().expect("disk");
    let pool = daemon.pool_status("verify");
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
    file.write_all_at(&vec![0xee; 4096], offset)
        .expect("overwrite");
    file.sync_all().expect("sync");

    let found = daemon.cli(&["--json", "space", "verify", "p"]);
    assert_eq!(found.code(), Some(1), "{}", found.describe());
    let report = found.json();
    assert_eq!(report["mismatched_rows"], 1, "{report}");
    let finding = &report["findings"][0];
    assert_eq!(
        (&finding["extent"], &finding["row"]),
        (&0.into(), &ROW.into()),
        "{report}"
    );
    let problem = &finding["problems"][0];
    // The block's checksum tells which slot is damaged: that one alone.
    assert_eq!(problem["kind"], "checksum", "{report}");
    assert_eq!(problem["damaged_found"], true, "{report}");
    assert_eq!(
        problem["places"].as_array().map(Vec::len),
        Some(1),
        "{report}"
    );
    let place = problem["places"]
        .as_array()
        .expect("places")
        .iter()
        .find(|place| place["slot"] == 0)
        .unwrap_or_else(|| panic!("slot 0 not named: {report}"));
    assert_eq!(place["disk"], disk, "{report}");
    assert_eq!(place["device"], device.as_str(), "{report}");
    assert_eq!(place["disk_offset"], offset, "{report}");

    let text = daemon.cli(&["space", "verify", "p"]);
    assert_eq!(text.code(), Some(1), "{}", text.describe());
    assert!(
        text.stdout.contains(&format!("row {ROW} of extent 0"))
            && text.stdout.contains(&format!("{device} at byte {offset}")),
        "{}",
        text.describe()
    );
    assert!(
        text.stderr.contains(
            "1 rows whose blocks fail their checksums or whose copies or parity disagree"
        ),
        "{}",
        text.describe()
    );
    daemon.stop();
}
