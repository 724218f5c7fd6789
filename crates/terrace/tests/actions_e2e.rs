//! What the daemon tells the admin, end to end through the CLI:
//!
//! - a parity space created while the journal disks are full still gets a
//!   log, on capacity disks, and the answer says where and why; one created
//!   with `--cache 0` gets one from `space cache`; one whose log fits
//!   nowhere is refused unless asked for without one (`--cache 0`);
//! - a space that does not fit is refused with the largest size that
//!   would, and its columns (what `--max` then gives);
//! - `pool status` gives one `action:` line (and `action` in `--json`) for
//!   each state the pool cannot leave on its own: a missing disk under
//!   `retire-missing never`, a log copy lost with no room to re-create it
//!   (and `job list` says why no repair started, at 0 %).

mod common;

use std::path::PathBuf;

use common::{delete_and_wait, disks_of, wait_until, zero_disk, Daemon, MIB};
use serde_json::Value;

const SLAB: &str = "16M";
const SLAB_BYTES: u64 = 16 * MIB;

/// `pool create NAME` over `capacity` files of `capacity_bytes` and two
/// journal files of `journal_bytes` (disks `capacity` and after).
fn pool_with_journals(
    daemon: &Daemon,
    name: &str,
    capacity: usize,
    capacity_bytes: u64,
    journal_bytes: u64,
) -> Vec<PathBuf> {
    let mut files = daemon.disk_files(&format!("{name}-cap"), capacity, capacity_bytes);
    files.extend(daemon.disk_files(&format!("{name}-jrn"), 2, journal_bytes));
    daemon.create_pool_with_usage(name, &files, capacity, "journal", SLAB);
    files
}

/// Free slabs of disk `disk` of pool `pool`.
fn free_slabs(daemon: &Daemon, pool: &str, disk: usize) -> u64 {
    let view = daemon.pool_status(pool)["disks"][disk].clone();
    view["slabs_total"].as_u64().expect("slabs_total") - view["slabs_used"].as_u64().expect("used")
}

/// A simple space `fill` whose log leaves `keep` slabs free on each of the
/// journal disks `first` and `first + 1`.
fn fill_journal_disks(daemon: &Daemon, pool: &str, first: usize, keep: u64) {
    let free = free_slabs(daemon, pool, first).min(free_slabs(daemon, pool, first + 1));
    let cache = format!("{}M", (free - keep) * SLAB_BYTES / MIB);
    daemon.create_space(
        pool,
        "fill",
        &["--layout", "simple", "--cache", &cache],
        "16M",
    );
    assert_eq!(free_slabs(daemon, pool, first), keep);
}

#[test]
fn a_parity_space_gets_a_log_on_its_own_disks_when_the_journal_disks_are_full() {
    let daemon = Daemon::start();
    pool_with_journals(&daemon, "lg", 4, 512 * MIB, 128 * MIB);
    fill_journal_disks(&daemon, "lg", 4, 0);
    let answer = daemon.cli_ok(&[
        "space", "create", "lg", "p", "--layout", "parity", "--size", "64M",
    ]);
    let why = ": 2 copies on capacity disks, as the journal disks have no room left for 1G";
    assert!(
        answer
            .stdout
            .contains("; write-back cache 32M, log on disks ")
            && answer.stdout.contains(why),
        "{}",
        answer.stdout
    );
    let view = daemon.cli_json(&["space", "show", "p"])["space"].clone();
    let cache = &view["cache"];
    assert_eq!(cache["bytes"], 32 * MIB, "{view}");
    assert_eq!(
        cache["placement"],
        format!("the write-back log of space p{why}"),
        "{view}"
    );
    let on_capacity = |cache: &Value| {
        cache["log_disks"]
            .as_array()
            .expect("log disks")
            .iter()
            .all(|disk| disk.as_u64().is_some_and(|disk| disk < 4))
    };
    assert!(on_capacity(cache), "{view}");

    let bare = daemon.create_space("lg", "q", &["--layout", "parity", "--cache", "0"], "64M");
    assert_eq!(bare["cache"], Value::Null, "{bare}");
    let given = daemon.cli_json(&["space", "cache", "q", "32M"]);
    assert_eq!(given["cache"]["bytes"], 32 * MIB, "{given}");
    assert!(on_capacity(&given["cache"]), "{given}");
}

/// A pool with no room for even a 32 MiB log beside a parity space
/// refuses the space, saying why and what would do, and changes nothing;
/// `--cache 0` creates it without a log, as asked.
#[test]
fn a_parity_space_without_room_for_its_log_is_refused_unless_asked_for_none() {
    let daemon = Daemon::start();
    let files = daemon.disk_files("tight", 3, 64 * MIB);
    daemon.create_pool("tight", &files, SLAB);
    let before = daemon.pool_status("tight");
    let refused = daemon.cli(&[
        "space", "create", "tight", "p", "--layout", "parity", "--size", "64M",
    ]);
    assert_eq!(refused.code(), Some(1), "{}", refused.describe());
    for said in [
        "write-back cache",
        "add a disk or a journal disk",
        "--cache 0",
    ] {
        assert!(refused.stderr.contains(said), "{}", refused.describe());
    }
    assert_eq!(daemon.pool_status("tight"), before, "nothing changed");
    let bare = daemon.create_space("tight", "p", &["--layout", "parity", "--cache", "0"], "64M");
    assert_eq!(bare["cache"], Value::Null, "{bare}");
}

#[test]
fn a_space_that_does_not_fit_says_the_largest_that_would() {
    let daemon = Daemon::start();
    let files = daemon.disk_files("fit", 5, 256 * MIB);
    daemon.create_pool("fit", &files, SLAB);
    let refused = daemon.cli(&[
        "space", "create", "fit", "big", "--layout", "parity", "--size", "100G",
    ]);
    assert_eq!(refused.code(), Some(1), "{}", refused.describe());
    let told = refused
        .stderr
        .split("100G does not fit: at most ")
        .nth(1)
        .unwrap_or_else(|| panic!("{}", refused.describe()));
    let (size, rest) = told.split_once(" with ").expect("with");
    let (columns, rest) = rest.split_once(" columns").expect("columns");
    assert!(rest.starts_with(" (--max); "), "{}", refused.stderr);
    // What --max gives.
    let answer = daemon.cli_ok(&[
        "space", "create", "fit", "big", "--layout", "parity", "--max",
    ]);
    assert!(
        answer.stdout.contains(&format!(", {size} (")),
        "told {size}: {}",
        answer.stdout
    );
    let view = daemon.cli_json(&["space", "show", "big"])["space"].clone();
    assert_eq!(view["columns"].to_string(), columns, "{view}");
}

/// Every action line of `pool status NAME` (text).
fn action_lines(daemon: &Daemon, pool: &str) -> Vec<String> {
    daemon
        .cli_ok(&["pool", "status", pool])
        .stdout
        .lines()
        .filter_map(|line| line.strip_prefix("action: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_missing_disk_under_retire_missing_never_asks_to_reconnect_or_replace_it() {
    let daemon = Daemon::start();
    let files = daemon.disk_files("nv", 3, 256 * MIB);
    daemon.create_pool("nv", &files, "8M");
    daemon.cli_json(&["pool", "set", "nv", "--retire-missing", "never"]);
    daemon.create_space("nv", "m", &["--layout", "mirror", "--columns", "1"], "8M");
    let status = daemon.pool_status("nv");
    assert_eq!(status["action"], Value::Null, "{status}");
    assert!(action_lines(&daemon, "nv").is_empty());
    let disk = disks_of(&daemon, "m")[0];
    delete_and_wait(&daemon, "nv", &files, disk);
    let status = daemon.pool_status("nv");
    let expected = format!(
        "reconnect disk {disk} ({}), or replace it: terrace disk replace nv {disk} DEVICE; or let \
         the pool repair it into free space: terrace pool set nv --retire-missing auto",
        status["disks"][disk]["device"].as_str().expect("device")
    );
    assert_eq!(status["action"], expected, "{status}");
    assert_eq!(status["disks"][disk]["action"], expected, "{status}");
    assert_eq!(action_lines(&daemon, "nv"), vec![expected]);
}

#[test]
fn a_log_copy_without_room_to_be_re_created_asks_for_a_disk() {
    let daemon = Daemon::start();
    let files = pool_with_journals(&daemon, "nr", 4, 256 * MIB, 128 * MIB);
    fill_journal_disks(&daemon, "nr", 4, 2);
    daemon.create_space("nr", "p", &["--layout", "parity", "--cache", "32M"], "64M");
    // Whatever the capacity disks have left goes to one more space.
    daemon.cli_json(&[
        "space", "create", "nr", "rest", "--layout", "simple", "--cache", "0", "--max",
    ]);
    // A wide space stops at the first disk that runs out: single slabs
    // left elsewhere go to one-column spaces.
    for more in 0..4 {
        if (0..4).all(|disk| free_slabs(&daemon, "nr", disk) == 0) {
            break;
        }
        let name = format!("rest{more}");
        daemon.cli_json(&[
            "space",
            "create",
            "nr",
            &name,
            "--layout",
            "simple",
            "--columns",
            "1",
            "--cache",
            "0",
            "--max",
        ]);
    }
    for disk in 0..6 {
        assert_eq!(free_slabs(&daemon, "nr", disk), 0, "disk {disk}");
    }
    assert_eq!(daemon.pool_status("nr")["action"], Value::Null);
    let journal = 5;
    zero_disk(&files[journal]);
    wait_until(&daemon, "the lost log copy's repair refused", || {
        let view = daemon.pool_status("nr");
        view["disks"][journal]["action"]
            .is_null()
            .then(|| view.to_string())
    });
    let status = daemon.pool_status("nr");
    let action = status["action"].as_str().expect("an action").to_string();
    assert!(
        action.starts_with("add a disk of at least ") && action.contains(", or a journal disk"),
        "{status}"
    );
    assert!(
        status["disks"][journal]["unrepaired"]
            .as_str()
            .is_some_and(|why| why.contains("no room")),
        "{status}"
    );
    assert_eq!(action_lines(&daemon, "nr"), vec![action]);
    let jobs = daemon.cli_json(&["job", "list"]);
    let repair = jobs
        .as_array()
        .expect("jobs")
        .iter()
        .find(|job| job["kind"] == "repair")
        .unwrap_or_else(|| panic!("no repair recorded: {jobs}"))
        .clone();
    assert_eq!(repair["state"], "failed", "{repair}");
    assert_eq!(repair["percent"], 0, "{repair}");
    assert!(
        repair["reason"]
            .as_str()
            .is_some_and(|why| why.starts_with("no repair started: no room")),
        "{repair}"
    );
}
