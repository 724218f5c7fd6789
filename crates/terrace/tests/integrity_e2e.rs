//! Checksums through the daemon, with real clients: bytes of one disk's
//! backing file (two, for dual parity) overwritten inside a space's data,
//! behind the daemon, never reach a client. qemu-io reads the pattern it
//! wrote; `pool status` counts the checksum errors against the damaged
//! disk and the daemon's log names it; `space verify` finds damage no read
//! touched, `pool scrub` repairs it, and a second scrub finds nothing.

mod common;

use std::os::unix::fs::FileExt;

use common::{command, run, skip_without, Daemon, GIB};
use serde_json::Value;
use terrace_engine::meta::format::data_offset;

struct Case {
    name: &'static str,
    args: &'static [&'static str],
    /// Slots damaged in the same row: the layout's redundancy.
    damaged: usize,
}

const CASES: &[Case] = &[
    Case {
        name: "m2",
        args: &["--layout", "mirror", "--copies", "2"],
        damaged: 1,
    },
    Case {
        name: "m3",
        args: &["--layout", "mirror", "--copies", "3"],
        damaged: 2,
    },
    Case {
        name: "p1",
        args: &["--layout", "parity", "--redundancy", "1"],
        damaged: 1,
    },
    Case {
        name: "p1-nolog",
        args: &["--layout", "parity", "--redundancy", "1", "--cache", "0"],
        damaged: 1,
    },
    Case {
        name: "p2",
        args: &["--layout", "parity", "--redundancy", "2"],
        damaged: 2,
    },
    Case {
        name: "p2-nolog",
        args: &["--layout", "parity", "--redundancy", "2", "--cache", "0"],
        damaged: 2,
    },
];

/// Where slot `slot` of extent 0 lies: its backing file and the byte
/// offset of the slab in it.
fn slab_of(daemon: &Daemon, pool: &str, space: &str, slot: usize) -> (String, u64, u64) {
    let detail = daemon.cli_json(&["space", "show", space, "--pool", pool]);
    let entry = &detail["extent_map"][0]["slots"][slot];
    let status = daemon.pool_status(pool);
    let slab_bytes = status["slab_bytes"].as_u64().expect("slab bytes");
    let start = data_offset(status["metadata_slot_bytes"].as_u64().expect("slot bytes"))
        + entry["slab"].as_u64().expect("slab") * slab_bytes;
    let disk = entry["disk"].as_u64().expect("disk");
    (
        entry["device"].as_str().expect("device").to_string(),
        start,
        disk,
    )
}

fn overwrite(device: &str, offset: u64, length: usize) {
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(device)
        .expect("backing file");
    file.write_all_at(&vec![0xee; length], offset)
        .expect("overwrite");
    file.sync_all().expect("sync");
}

fn qemu_io(daemon: &Daemon, export: &str, commands: &[&str]) -> String {
    let mut io = command("qemu-io");
    io.args(["-f", "raw", "-t", "none"]).arg(daemon.uri(export));
    for c in commands {
        io.args(["-c", c]);
    }
    let result = run(&mut io);
    let output = format!("{}{}", result.stdout, result.stderr);
    assert!(
        result.success() && !output.contains("failed") && !output.contains("Pattern verification"),
        "qemu-io on {export} {commands:?}\n{}",
        result.describe()
    );
    output
}

fn checksum_errors(daemon: &Daemon, pool: &str) -> Vec<u64> {
    let status = daemon.pool_status(pool);
    status["disks"]
        .as_array()
        .expect("disks")
        .iter()
        .map(|disk| disk["checksum_errors"].as_u64().expect("checksum_errors"))
        .collect()
}

/// `pool scrub POOL`, waited for: the finished job as `job list` has it.
fn scrub(daemon: &Daemon, pool: &str) -> Value {
    let began = std::time::Instant::now();
    // The last scrub may be listed done a moment before its end is
    // committed; a new one is refused until then.
    let started = loop {
        let answer = daemon.cli(&["--json", "pool", "scrub", pool]);
        if answer.success() {
            break answer.json();
        }
        assert!(
            answer.stderr.contains("already under way") && began.elapsed().as_secs() < 30,
            "{}",
            answer.describe()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let id = started["id"].as_u64().expect("job id");
    loop {
        let jobs = daemon.cli_json(&["job", "list"]);
        let job = jobs
            .as_array()
            .expect("jobs")
            .iter()
            .find(|job| job["id"] == id)
            .cloned()
            .expect("the scrub is listed");
        if job["state"] != "running" {
            return job;
        }
        assert!(began.elapsed().as_secs() < 120, "scrub stuck: {job}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// `space verify`: its exit code and its report.
fn verify(daemon: &Daemon, pool: &str, space: &str) -> (Option<i32>, Value) {
    let result = daemon.cli(&["--json", "space", "verify", space, "--pool", pool]);
    (result.code(), result.json())
}

#[test]
fn damage_in_a_backing_file_is_rebuilt_counted_named_and_scrubbed_in_every_redundant_layout() {
    if skip_without("qemu", &["qemu-io"]) {
        return;
    }
    let daemon = Daemon::start();
    for case in CASES {
        let pool = format!("i{}", case.name.replace('-', ""));
        let disks = daemon.disk_files(&pool, 6, GIB);
        daemon.create_pool(&pool, &disks, "16M");
        let view = daemon.create_space(&pool, case.name, case.args, "64M");
        assert_eq!(view["checksums"], "on", "{view}");
        // Every slot of extent 0 holds the pattern's bytes (or parity).
        qemu_io(&daemon, case.name, &["write -P 0x5a 0 32M", "flush"]);
        // Damage 64 KiB pieces at `at` into the slabs: a mirror's every
        // copy, each in other blocks (whichever copy a read picks, it meets
        // damage); a parity space's `damaged` slots in the same row, a
        // row per slot (parity rotates: in most rows the slot is data).
        let slots = daemon.cli_json(&["space", "show", case.name, "--pool", &pool])["extent_map"]
            [0]["slots"]
            .as_array()
            .expect("slots")
            .len();
        let mirror = case.args.contains(&"mirror");
        let damage = |daemon: &Daemon, at: u64| {
            let mut disks = Vec::new();
            for row in 0..slots as u64 {
                for k in 0..case.damaged as u64 {
                    let (slot, offset) = if mirror {
                        (row as usize, at + row * (64 << 10))
                    } else {
                        (((row + k) % slots as u64) as usize, at + row * (256 << 10))
                    };
                    let (device, start, disk) = slab_of(daemon, &pool, case.name, slot);
                    overwrite(&device, start + offset, 64 << 10);
                    disks.push(disk);
                    if mirror {
                        break;
                    }
                }
            }
            disks
        };
        let damaged_disks = damage(&daemon, 1 << 20);
        // Reads of the whole extent return the pattern, every time.
        for _ in 0..2 {
            qemu_io(&daemon, case.name, &["read -P 0x5a 0 32M"]);
        }
        let errors = checksum_errors(&daemon, &pool);
        assert!(errors.iter().sum::<u64>() >= 1, "{}: {errors:?}", case.name);
        for (disk, count) in errors.iter().enumerate() {
            assert!(
                *count == 0 || damaged_disks.contains(&(disk as u64)),
                "{}: disk {disk} was not damaged: {errors:?}",
                case.name
            );
        }
        let log = daemon.log_text();
        assert!(
            log.contains("checksum error repaired") && log.contains(case.name),
            "{}: the log names no repair:\n{}",
            case.name,
            daemon.log_tail()
        );
        // Damaged again, elsewhere, and not read: a verify finds it and
        // names the damaged slots by their checksums.
        damage(&daemon, 5 << 20);
        let (code, report) = verify(&daemon, &pool, case.name);
        assert_eq!(code, Some(1), "{}: {report}", case.name);
        let findings = report["findings"].as_array().expect("findings");
        assert!(
            findings
                .iter()
                .flat_map(|finding| finding["problems"].as_array().into_iter().flatten())
                .any(|problem| problem["kind"] == "checksum"),
            "{}: {report}",
            case.name
        );
        // The scrub repairs what no read touched; a second finds nothing.
        let first = scrub(&daemon, &pool);
        assert_eq!(first["state"], "done", "{}: {first}", case.name);
        assert!(
            first["repaired"].as_u64().unwrap_or(0) >= 1,
            "{}: {first}",
            case.name
        );
        assert_eq!(first["unrepaired"], 0, "{}: {first}", case.name);
        let second = scrub(&daemon, &pool);
        let (code, report) = verify(&daemon, &pool, case.name);
        assert_eq!(code, Some(0), "{}: after the scrub: {report}", case.name);
        assert_eq!(second["repaired"], 0, "{}: {second}", case.name);
        qemu_io(&daemon, case.name, &["read -P 0x5a 0 32M"]);
    }
}

fn disk_errors(daemon: &Daemon, pool: &str, disk: usize) -> (String, u64, u64) {
    let status = daemon.pool_status(pool);
    let disk = &status["disks"][disk];
    let count = |name: &str| disk[name].as_u64().expect("a counter");
    (
        disk["state"].as_str().expect("state").to_string(),
        count("read_errors"),
        count("write_errors"),
    )
}

/// A disk whose reads fail below its file (nbdkit's error filter under
/// nbdfuse: EIO from the kernel, as an unreadable surface returns) is not
/// failed at its first error: every byte a client reads is rebuilt from
/// the other copy, the unreadable rows are rewritten, and the disk's READ
/// count goes up and the log names it. Once its errors reach the pool's
/// limit it is failed; the space serves on, and `pool clear` takes the
/// disk back, counters at zero, and it catches up.
#[test]
fn read_errors_are_rebuilt_counted_and_fail_a_disk_only_at_the_limit() {
    if skip_without(
        "the read error test",
        &["nbdkit", "nbdfuse", "nbdcopy", "qemu-io"],
    ) {
        return;
    }
    const MIB: u64 = 1 << 20;
    let folder = tempfile::tempdir().expect("a folder for the disks");
    let faulty = common::FaultyDisk::unreadable(folder.path(), "d1", GIB);
    let mut daemon = Daemon::start();
    let mut files = daemon.disk_files("reads", 1, GIB);
    files.push(faulty.file.clone());
    daemon.create_pool("tank", &files, "16M");
    daemon.create_space(
        "tank",
        "m",
        &["--layout", "mirror", "--copies", "2", "--cache", "0"],
        "64M",
    );
    daemon.cli_ok(&["pool", "set", "tank", "--error-limit", "0"]);
    let source = daemon.temp().join("m.src");
    std::fs::write(&source, common::random_bytes(7, 64 * MIB as usize)).expect("source");
    common::run_ok(command("nbdcopy").arg(&source).arg(daemon.uri("m")));
    let copy = daemon.temp().join("m.copy");

    // No limit: every read error is survived and rewritten.
    faulty.fail();
    common::run_ok(command("nbdcopy").arg(daemon.uri("m")).arg(&copy));
    faulty.heal();
    assert_eq!(
        common::sha256_file(&copy, None),
        common::sha256_file(&source, None)
    );
    let (state, read, write) = disk_errors(&daemon, "tank", 1);
    assert_eq!((state.as_str(), write), ("ONLINE", 0), "{state} {write}");
    assert!(read > 0, "the copy on disk 1 was read from");
    let log = daemon.log_text();
    assert!(
        log.contains("read error on disk 1 in the row at")
            && log.contains("rebuilt from redundancy and rewritten there"),
        "{}",
        daemon.log_tail()
    );
    let (code, report) = verify(&daemon, "tank", "m");
    assert_eq!(code, Some(0), "{report}");

    // A limit of 3: the third error fails the disk; clients see nothing.
    daemon.cli_ok(&["pool", "set", "tank", "--error-limit", "3"]);
    faulty.fail();
    std::fs::remove_file(&copy).expect("remove the copy");
    common::run_ok(command("nbdcopy").arg(daemon.uri("m")).arg(&copy));
    faulty.heal();
    assert_eq!(
        common::sha256_file(&copy, None),
        common::sha256_file(&source, None)
    );
    let status = daemon.pool_status("tank");
    assert_eq!(status["disks"][1]["state"], "FAILED", "{status}");
    let reason = status["disks"][1]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("read and checksum errors within 600 s"),
        "{reason}"
    );
    let cleared = daemon.cli_ok(&["pool", "clear", "tank"]).stdout;
    assert!(cleared.contains("taken back"), "{cleared}");
    let (state, read, _) = disk_errors(&daemon, "tank", 1);
    assert_eq!(read, 0, "pool clear set the counters to zero ({state})");
    qemu_io(&daemon, "m", &["read 0 64M"]);
    daemon.stop();
}
