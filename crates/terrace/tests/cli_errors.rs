//! The CLI refuses what is wrong with the documented exit code (1 failure,
//! 2 usage), says what was wrong, and changes nothing on any disk. And every
//! listing prints, with `--json`, the API's fields.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{content_fingerprint, Daemon, Run, MIB};
use serde_json::Value;

/// Content fingerprints of every file in the disks folder.
fn fingerprints(daemon: &Daemon) -> BTreeMap<PathBuf, String> {
    let folder = daemon.root.join("disks");
    std::fs::read_dir(&folder)
        .unwrap_or_else(|e| panic!("read {}: {e}", folder.display()))
        .flatten()
        .map(|entry| (entry.path(), content_fingerprint(&entry.path())))
        .collect()
}

struct Setup {
    daemon: Daemon,
    /// Disks of pool `alpha`.
    alpha: Vec<PathBuf>,
    /// Blank disks.
    blank: Vec<PathBuf>,
}

impl Setup {
    fn new() -> Setup {
        let daemon = Daemon::start();
        let alpha = daemon.disk_files("alpha", 3, 256 * MIB);
        let blank = daemon.disk_files("blank", 3, 256 * MIB);
        daemon.create_pool("alpha", &alpha, "8M");
        Setup {
            daemon,
            alpha,
            blank,
        }
    }

    fn all_disks(&self) -> Vec<PathBuf> {
        self.alpha.iter().chain(&self.blank).cloned().collect()
    }

    fn path(disk: &Path) -> String {
        disk.display().to_string()
    }

    /// Run `terrace COMMAND-LINE` (words split on spaces), with `input` on
    /// its standard input; it must exit with `code`, mention every one of
    /// `mentions` in its message, and leave every disk file and every pool
    /// as they were.
    #[track_caller]
    fn refused(&self, line: &str, input: Option<&str>, code: i32, mentions: &[&str]) -> Run {
        let args: Vec<&str> = line.split_whitespace().collect();
        let before = fingerprints(&self.daemon);
        let pools_before = self.daemon.cli_json(&["pool", "status"]);
        let answer = match input {
            Some(input) => self.daemon.cli_input(&args, input),
            None => self.daemon.cli(&args),
        };
        assert_eq!(
            answer.code(),
            Some(code),
            "exit code of terrace {line}\n{}",
            answer.describe()
        );
        let message = answer.stderr.to_lowercase();
        for mention in mentions {
            assert!(
                message.contains(&mention.to_lowercase()),
                "the message of terrace {line} does not mention {mention:?}\n{}",
                answer.describe()
            );
        }
        assert_eq!(
            fingerprints(&self.daemon),
            before,
            "terrace {line} changed a disk file"
        );
        let pools_after = self.daemon.cli_json(&["pool", "status"]);
        assert_eq!(pools_after, pools_before, "terrace {line} changed a pool");
        answer
    }
}

#[test]
fn refused_commands_say_why_and_change_nothing() {
    let setup = Setup::new();
    let daemon = &setup.daemon;
    let (a1, b0, b1) = (
        Setup::path(&setup.alpha[1]),
        Setup::path(&setup.blank[0]),
        Setup::path(&setup.blank[1]),
    );

    // Dual parity needs 4 disks; alpha has 3.
    setup.refused(
        "space create alpha dp --layout parity --redundancy 2 --size 64M",
        None,
        1,
        &["dual parity", "at least 4"],
    );
    // More than the pool holds.
    setup.refused(
        "space create alpha big --layout simple --size 100G",
        None,
        1,
        &["capacity", "100G as a simple space", "raw", "free slabs"],
    );
    // A disk of alpha in a new pool.
    setup.refused(
        &format!("pool create beta {b0} {a1} --slab 8M"),
        None,
        1,
        &[&a1, "alpha"],
    );
    // The same disk twice.
    setup.refused(
        &format!("pool create beta {b0} {b0} --slab 8M"),
        None,
        1,
        &[&b0, "twice"],
    );
    // --usage is every disk's: a pool of journal disks alone holds nothing.
    setup.refused(
        &format!("pool create beta {b0} {b1} --usage journal --slab 8M"),
        None,
        1,
        &["holds capacity", "usage journal", "ssd.img,usage=journal"],
    );
    // A model override the model does not have; one before its model.
    setup.refused(
        &format!("pool create beta {b0},model=ssd-sata,units=4,bogus=1 {b1} --slab 8M"),
        None,
        1,
        &["bogus", "units"],
    );
    setup.refused(
        &format!("pool create beta {b0},wcache=0,model=hdd-7k {b1} --slab 8M"),
        None,
        2,
        &["wcache", "model=hdd-7k,wcache=0"],
    );
    // Sizes, layouts and settings that make no sense are usage errors.
    setup.refused(
        "space create alpha s --layout simple --size 12Q",
        None,
        2,
        &["12Q"],
    );
    setup.refused(
        "space create alpha s --layout raid5 --size 64M",
        None,
        2,
        &["raid5"],
    );
    setup.refused(
        "space create alpha s --layout parity --copies 2 --size 64M",
        None,
        2,
        &["--copies"],
    );
    setup.refused(
        "space create alpha s --layout simple --size 0",
        None,
        2,
        &["size"],
    );
    setup.refused(
        &format!("pool create beta {b0} {b1} --slab 3M"),
        None,
        2,
        &["slab"],
    );
    // A disk file that does not exist.
    let missing = daemon.root.join("disks/missing.img");
    let missing_text = missing.display().to_string();
    setup.refused(
        &format!("pool create beta {b0} {missing_text} --slab 8M"),
        None,
        1,
        &[&missing_text],
    );
    assert!(!missing.exists(), "pool create made {missing_text}");
    // A disk file too small to hold metadata and a slab.
    let tiny = daemon.root.join("disks/tiny.img");
    common::sparse_file(&tiny, MIB);
    let tiny_text = tiny.display().to_string();
    setup.refused(
        &format!("pool create beta {b0} {tiny_text} --slab 8M"),
        None,
        1,
        &[&tiny_text, "is 1M; a pool disk needs at least"],
    );
    // A name already taken.
    setup.refused(
        &format!("pool create alpha {b0} {b1} --slab 8M"),
        None,
        1,
        &["alpha", "already"],
    );

    // Deleting and destroying ask first; "no" changes nothing.
    daemon.create_space("alpha", "keep", &["--layout", "mirror"], "32M");
    setup.refused(
        "space create alpha keep --layout simple --size 8M",
        None,
        1,
        &["keep", "exists"],
    );
    setup.refused(
        "space resize keep --size 100G",
        None,
        1,
        &["keep", "growing from 32M to 100G", "free slabs"],
    );
    // A negative size is a bad size, not an unknown option.
    setup.refused("space cache keep -1", None, 2, &["invalid value '-1'"]);
    setup.refused(
        "pool set alpha --repair-rate 5",
        None,
        2,
        &["at least 1M", "unlimited"],
    );
    // What status shows for no limit is also what sets it.
    let view = daemon.cli_json(&["pool", "set", "alpha", "--repair-rate", "200M"]);
    assert_eq!(
        view["settings"]["repair_rate_bytes_per_second"],
        200 << 20,
        "{view}"
    );
    let view = daemon.cli_json(&["pool", "set", "alpha", "--repair-rate", "unlimited"]);
    assert_eq!(
        view["settings"]["repair_rate_bytes_per_second"], 0,
        "{view}"
    );
    setup.refused(
        "space cache keep 0",
        None,
        2,
        &["resized, not removed", "32M to 100G"],
    );
    let answer = setup.refused("space delete keep", Some("no\n"), 1, &["not confirmed"]);
    assert!(
        answer.stdout.contains("keep"),
        "the question names the space\n{}",
        answer.describe()
    );
    assert_eq!(
        daemon.cli_json(&["space", "list"]).as_array().map(Vec::len),
        Some(1)
    );
    let answer = setup.refused("pool destroy alpha", Some("no\n"), 1, &["not confirmed"]);
    assert!(
        answer.stdout.contains("alpha"),
        "the question names the pool\n{}",
        answer.describe()
    );
    // No answer at all is no confirmation either.
    setup.refused("pool destroy alpha", Some(""), 1, &["not confirmed"]);
    setup.refused("space delete keep", Some(""), 1, &["not confirmed"]);

    // Unknown names.
    setup.refused("pool status nope", None, 1, &["nope"]);
    setup.refused("space show nope", None, 1, &["nope"]);
    setup.refused("space delete nope --yes", None, 1, &["nope"]);
    setup.refused("pool export nope", None, 1, &["nope"]);

    // Typing the name does it.
    daemon
        .cli_input(&["space", "delete", "keep"], "keep\n")
        .check();
    assert_eq!(daemon.cli_json(&["space", "list"]), serde_json::json!([]));
    daemon
        .cli_input(&["pool", "destroy", "alpha"], "alpha\n")
        .check();
    assert_eq!(daemon.cli_json(&["pool", "list"]), serde_json::json!([]));
    let disks: Vec<String> = setup.alpha.iter().map(|disk| Setup::path(disk)).collect();
    let mut args = vec!["disk", "list"];
    args.extend(disks.iter().map(String::as_str));
    for candidate in daemon.cli_json(&args).as_array().expect("disk list") {
        assert_eq!(
            candidate["status"], "available",
            "a disk of a destroyed pool: {candidate}"
        );
    }
}

/// Values outside the documented ones (`--copies 2|3`, `--redundancy
/// 1|2`) are usage errors, like an unknown `--layout`.
#[test]
fn layout_values_outside_the_documented_ones_are_usage_errors() {
    let setup = Setup::new();
    setup.refused(
        "space create alpha s --layout mirror --copies 4 --size 64M",
        None,
        2,
        &["4"],
    );
    setup.refused(
        "space create alpha s --layout mirror --copies 1 --size 64M",
        None,
        2,
        &["1"],
    );
    setup.refused(
        "space create alpha s --layout parity --redundancy 3 --size 64M",
        None,
        2,
        &["3"],
    );
}

#[test]
fn no_daemon_is_a_clear_failure() {
    let dir = tempfile::tempdir().expect("temp dir");
    let socket = dir.path().join("control.sock");
    let answer = common::run(
        std::process::Command::new(common::TERRACE)
            .arg("--control")
            .arg(&socket)
            .arg("status"),
    );
    assert_eq!(answer.code(), Some(1), "{}", answer.describe());
    assert!(
        answer.stderr.contains("cannot reach the daemon"),
        "{}",
        answer.describe()
    );
}

fn object<'a>(value: &'a Value, what: &str) -> &'a serde_json::Map<String, Value> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("{what} is not an object: {value}"))
}

/// `value` has every field of `fields`, each of the named JSON kind.
#[track_caller]
fn has_fields(value: &Value, what: &str, fields: &[(&str, &str)]) {
    let map = object(value, what);
    for (field, kind) in fields {
        let found = map
            .get(*field)
            .unwrap_or_else(|| panic!("{what} lacks {field}: {value}"));
        let ok = match *kind {
            "string" => found.is_string(),
            "number" => found.is_u64(),
            "bool" => found.is_boolean(),
            "array" => found.is_array(),
            "object" => found.is_object(),
            "string?" => found.is_string() || found.is_null(),
            "number?" => found.is_u64() || found.is_null(),
            other => panic!("unknown kind {other}"),
        };
        assert!(ok, "{what}.{field} is not a {kind}: {found}");
    }
}

const SUMMARY: [(&str, &str); 10] = [
    ("name", "string"),
    ("id", "string"),
    ("state", "string"),
    ("reason", "string"),
    ("disk_count", "number"),
    ("space_count", "number"),
    ("capacity_bytes", "number"),
    ("allocated_bytes", "number"),
    ("journal_bytes", "number"),
    ("journal_allocated_bytes", "number"),
];

const DISK: [(&str, &str); 12] = [
    ("index", "number"),
    ("id", "string"),
    ("device", "string"),
    ("state", "string"),
    ("reason", "string?"),
    ("media", "string"),
    ("usage", "string"),
    ("size_bytes", "number"),
    ("slabs_total", "number"),
    ("slabs_used", "number"),
    ("enclosure", "string?"),
    ("node", "string?"),
];

const SPACE: [(&str, &str); 25] = [
    ("pool", "string"),
    ("name", "string"),
    ("layout", "string"),
    ("layout_description", "string"),
    ("copies", "number"),
    ("redundancy", "number"),
    ("columns", "number"),
    ("data_columns", "number"),
    ("columns_reason", "string"),
    ("interleave_bytes", "number"),
    ("size_bytes", "number"),
    ("raw_bytes", "number"),
    ("extents", "number"),
    ("fault_domain", "string"),
    ("failures_tolerated", "number"),
    ("health", "string"),
    ("survives", "number?"),
    ("read_only", "bool"),
    ("export", "string"),
    ("resync_extents_left", "number"),
    ("resync_extents_total", "number"),
    ("resync_bytes_total", "number"),
    ("resync_bytes_done", "number"),
    ("resync_rate_bytes_per_second", "number"),
    ("resync_eta_seconds", "number?"),
];

#[test]
fn every_listing_prints_the_api_fields_as_json() {
    let mut setup = Setup::new();
    let daemon = &setup.daemon;
    daemon.create_space("alpha", "m", &["--layout", "mirror"], "32M");
    daemon.create_space("alpha", "p", &["--layout", "parity"], "48M");

    let status = daemon.cli_json(&["status"]);
    has_fields(
        &status,
        "status",
        &[
            ("version", "string"),
            ("pid", "number"),
            ("control_socket", "string"),
            ("nbd_tcp", "string?"),
            ("nbd_socket", "string?"),
            ("state_dir", "string"),
            ("pools", "array"),
        ],
    );
    assert_eq!(status["pools"], serde_json::json!(["alpha"]));
    assert_eq!(
        status["nbd_socket"].as_str(),
        Some(daemon.nbd_socket.to_str().unwrap())
    );

    let pools = daemon.cli_json(&["pool", "list"]);
    let list = pools
        .as_array()
        .unwrap_or_else(|| panic!("pool list: {pools}"));
    assert_eq!(list.len(), 1, "{pools}");
    has_fields(&list[0], "pool list entry", &SUMMARY);
    assert_eq!(list[0]["name"], "alpha");
    assert_eq!(list[0]["state"], "ONLINE");
    assert_eq!(list[0]["disk_count"], 3);
    assert_eq!(list[0]["space_count"], 2);

    let pool = daemon.pool_status("alpha");
    has_fields(&pool, "pool status", &SUMMARY);
    has_fields(
        &pool,
        "pool status",
        &[
            ("generation", "number"),
            ("slab_bytes", "number"),
            ("read_only", "string?"),
            ("disks", "array"),
            ("spaces", "array"),
        ],
    );
    assert_eq!(pool["slab_bytes"].as_u64(), Some(8 * MIB));
    assert_eq!(pool["read_only"], Value::Null);
    let disks = pool["disks"].as_array().expect("disks");
    assert_eq!(
        pool["disk_count"].as_u64(),
        Some(disks.len() as u64),
        "{pool}"
    );
    assert_eq!(
        pool["space_count"].as_u64(),
        pool["spaces"].as_array().map(|s| s.len() as u64),
        "{pool}"
    );
    assert_eq!(disks.len(), 3);
    for disk in disks {
        has_fields(disk, "pool status disk", &DISK);
        assert_eq!(disk["state"], "ONLINE", "{disk}");
        assert_eq!(disk["size_bytes"].as_u64(), Some(256 * MIB), "{disk}");
    }
    let mut devices: Vec<&str> = disks.iter().filter_map(|d| d["device"].as_str()).collect();
    devices.sort();
    let mut expected: Vec<String> = setup.alpha.iter().map(|disk| Setup::path(disk)).collect();
    expected.sort();
    assert_eq!(devices, expected);

    let spaces = daemon.cli_json(&["space", "list"]);
    let spaces = spaces
        .as_array()
        .unwrap_or_else(|| panic!("space list: {spaces}"));
    assert_eq!(spaces.len(), 2);
    for space in spaces {
        has_fields(space, "space list entry", &SPACE);
        assert_eq!(space["pool"], "alpha");
        assert_eq!(space["health"], "healthy");
    }
    let by_name = |name: &str| {
        spaces
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
            .expect("space listed")
    };
    assert_eq!(by_name("m")["size_bytes"].as_u64(), Some(32 * MIB));
    assert_eq!(by_name("m")["copies"], 2);
    assert_eq!(by_name("p")["size_bytes"].as_u64(), Some(48 * MIB));
    assert_eq!(by_name("p")["redundancy"], 1);
    assert_eq!(
        daemon
            .cli_json(&["space", "list", "alpha"])
            .as_array()
            .map(Vec::len),
        Some(2)
    );

    let detail = daemon.cli_json(&["space", "show", "p"]);
    has_fields(
        &detail,
        "space show",
        &[
            ("space", "object"),
            ("explanation", "array"),
            ("extent_map", "array"),
        ],
    );
    has_fields(&detail["space"], "space show space", &SPACE);
    let extents = detail["extent_map"].as_array().expect("extent map");
    assert!(!extents.is_empty(), "{detail}");
    for extent in extents {
        has_fields(
            extent,
            "extent",
            &[
                ("index", "number"),
                ("offset_bytes", "number"),
                ("length_bytes", "number"),
                ("slots", "array"),
                ("write_intent", "bool"),
            ],
        );
        let slots = extent["slots"].as_array().expect("slots");
        assert_eq!(
            slots.len() as u64,
            detail["space"]["columns"].as_u64().unwrap(),
            "{extent}"
        );
        for slot in slots {
            has_fields(
                slot,
                "slot",
                &[
                    ("slot", "number"),
                    ("role", "string"),
                    ("disk", "number"),
                    ("device", "string"),
                    ("slab", "number"),
                    ("state", "string"),
                ],
            );
        }
    }

    let paths: Vec<String> = setup
        .all_disks()
        .iter()
        .map(|disk| Setup::path(disk))
        .collect();
    let mut args = vec!["disk", "list"];
    args.extend(paths.iter().map(String::as_str));
    let candidates = daemon.cli_json(&args);
    let candidates = candidates
        .as_array()
        .unwrap_or_else(|| panic!("disk list: {candidates}"));
    assert_eq!(candidates.len(), 6);
    for candidate in candidates {
        has_fields(
            candidate,
            "disk list entry",
            &[
                ("device", "string"),
                ("kind", "string"),
                ("size_bytes", "number"),
                ("status", "string"),
                ("reason", "string?"),
            ],
        );
        assert!(candidate["holds"].is_null(), "{candidate}");
        assert_eq!(candidate["kind"], "file");
        let device = candidate["device"].as_str().unwrap();
        if device.contains("/alpha-") {
            assert_eq!(candidate["status"], "in-pool", "{candidate}");
            assert!(
                candidate["reason"].as_str().unwrap().contains("alpha"),
                "{candidate}"
            );
        } else {
            // 256 MiB: room for 8M slabs, not for the default 256M.
            assert_eq!(candidate["status"], "available", "{candidate}");
            let reason = candidate["reason"].as_str().unwrap_or_default();
            assert!(
                reason.contains("default 256M slabs") && reason.contains("--slab 128M"),
                "{candidate}"
            );
        }
    }

    // The text forms print too, and exit 0.
    for args in [
        &["pool", "list"][..],
        &["pool", "status"],
        &["pool", "status", "alpha"],
        &["space", "list"],
        &["space", "show", "m"],
        &["status"],
    ] {
        let answer = daemon.cli(args);
        assert!(
            answer.success() && answer.stdout.contains("alpha"),
            "terrace {args:?} in text form\n{}",
            answer.describe()
        );
    }
    let (b0, b1) = (Setup::path(&setup.blank[0]), Setup::path(&setup.blank[1]));
    let answer = daemon.cli(&["pool", "create", "gamma", &b0, &b1, "--slab", "8M"]);
    assert!(
        answer.success() && answer.stdout.contains("gamma"),
        "pool create in text form\n{}",
        answer.describe()
    );
    setup.daemon.stop();
}

/// Names of pools and spaces (export names) are plain words: `.`, `..`,
/// hidden and option-like names are refused, at creation, as usage errors.
#[test]
fn names_that_are_not_plain_words_are_refused() {
    let setup = Setup::new();
    let (b0, b1) = (Setup::path(&setup.blank[0]), Setup::path(&setup.blank[1]));
    for name in [".", "..", ".hidden", "_x", "a/b"] {
        setup.refused(
            &format!("pool create {name} {b0} {b1} --slab 8M"),
            None,
            2,
            &["invalid pool name", "starting with a letter or digit"],
        );
        setup.refused(
            &format!("space create alpha {name} --layout simple --size 8M"),
            None,
            2,
            &["invalid space name", "starting with a letter or digit"],
        );
    }
}

/// Space and cache sizes are whole 4 KiB blocks: anything else is refused
/// with the two nearest sizes, not rounded behind the user's back.
#[test]
fn sizes_that_are_not_whole_blocks_are_refused() {
    let setup = Setup::new();
    setup.refused(
        "space create alpha s --layout simple --size 1000001",
        None,
        2,
        &["1000001 bytes", "multiple of 4K", "999424", "1003520"],
    );
    setup.refused(
        "space create alpha s --layout parity --size 8M --cache 33554433",
        None,
        2,
        &["cache size", "33554432", "33558528"],
    );
    setup
        .daemon
        .create_space("alpha", "s", &["--layout", "simple"], "8M");
    setup.refused(
        "space resize s --size 16777217",
        None,
        2,
        &["space size", "16777216", "16781312"],
    );
    setup.refused(
        "space cache s 33558527",
        None,
        2,
        &["cache size", "33554432", "33558528"],
    );
}

/// `pool import` of a path that does not exist says so. (One with no
/// paths, which looks through /dev, is not run here: it could take the
/// loop devices of tests running beside it.)
#[test]
fn pool_import_of_a_missing_path_says_so() {
    let setup = Setup::new();
    let missing = setup.daemon.root.join("disks/nowhere.img");
    let missing_text = Setup::path(&missing);
    setup.refused(
        &format!("pool import {missing_text}"),
        None,
        1,
        &[&missing_text, "no such file"],
    );
}

/// A path appears once in the error about it.
#[test]
fn an_error_about_a_disk_names_its_path_once() {
    let setup = Setup::new();
    let b0 = Setup::path(&setup.blank[0]);
    let missing = Setup::path(&setup.daemon.root.join("disks/absent.img"));
    let answer = setup.refused(
        &format!("pool create beta {b0} {missing} --slab 8M"),
        None,
        1,
        &[&missing, "No such file"],
    );
    assert_eq!(
        answer.stderr.matches(missing.as_str()).count(),
        1,
        "{}",
        answer.describe()
    );
}

/// The same file under two paths is one disk: refused when given twice
/// in one command, and when it is already an open pool's disk.
#[test]
fn a_disk_under_another_path_is_the_same_disk() {
    let setup = Setup::new();
    let disks = setup.daemon.root.join("disks");
    let b0 = Setup::path(&setup.blank[0]);
    let b1 = Setup::path(&setup.blank[1]);
    let name = setup.blank[0].file_name().unwrap().to_string_lossy();
    // disks/../disks/blank-0.img, and a symbolic link to it.
    let dotted = format!("{}/../disks/{name}", disks.display());
    let link = disks.join("link.img");
    std::os::unix::fs::symlink(&setup.blank[0], &link).expect("symlink");
    let link = Setup::path(&link);
    for other in [&dotted, &link] {
        setup.refused(
            &format!("pool create beta {b0} {b1} {other} --slab 8M"),
            None,
            1,
            &[&b0, other, "same disk", "given twice"],
        );
    }
    let a0 = Setup::path(&setup.alpha[0]);
    let alpha_name = setup.alpha[0].file_name().unwrap().to_string_lossy();
    let alpha_dotted = format!("{}/../disks/{alpha_name}", disks.display());
    setup.refused(
        &format!("pool create beta {b0} {alpha_dotted} --slab 8M"),
        None,
        1,
        &[&alpha_dotted, "already disk 0 of pool alpha", &a0],
    );
    setup.refused(
        &format!("disk add alpha {alpha_dotted}"),
        None,
        1,
        &[&alpha_dotted, "already disk 0 of pool alpha"],
    );
}

/// `pool clear` of a disk missing since the pool was imported says it is
/// not present, why, and how to add it back.
#[test]
fn clearing_a_disk_not_present_says_how_to_add_it() {
    let mut daemon = Daemon::start();
    let disks = daemon.disk_files("gone", 3, 256 * MIB);
    daemon.create_pool("tank", &disks, "8M");
    daemon.stop();
    std::fs::rename(&disks[1], disks[1].with_extension("away")).expect("move a disk away");
    daemon.restart();
    let refused = daemon.cli(&["pool", "clear", "tank", "1"]);
    assert_eq!(refused.code(), Some(2), "{}", refused.describe());
    let message = &refused.stderr;
    assert!(
        message.contains("disk 1 of pool tank is not one to clear: it is not present (")
            && message.contains("): plug it back in, or add it with `terrace disk add`"),
        "{}",
        refused.describe()
    );
}
