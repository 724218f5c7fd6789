//! The write-back cache end to end: SIGKILL the daemon during a fio
//! random-write run with verify on a journaled dual-parity space, restart,
//! and fio's verify of every acknowledged write passes and a full parity
//! check finds no mismatch — with the log held in memory, and with no log
//! memory at all (every logged block read back from the journal disks).
//! The daemon's log memory is shared by its pools.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{command, run_with, skip_without, Daemon, GIB};

/// fio's nbd engine: four jobs, each one request at a time on its own
/// quarter, so every write fio counts as done was acknowledged.
fn fio(uri: &str, dir: &Path, extra: &[&str]) -> std::process::Command {
    let mut fio = command("fio");
    fio.current_dir(dir).args([
        "--name=crash",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=1",
        "--numjobs=4",
        "--size=32M",
        "--offset_increment=32M",
        "--verify=crc32c",
        "--randrepeat=1",
    ]);
    fio.args(extra);
    fio
}

/// Pool `wb` of `capacity` 1 GiB files and `journals` journal files of
/// `journal_bytes`, 16 MiB slabs; the journal disks come last.
fn journaled_pool(daemon: &Daemon, capacity: usize, journals: usize, journal_bytes: u64) {
    let mut disks: Vec<String> = daemon
        .disk_files("cap", capacity, GIB)
        .iter()
        .map(|p| p.display().to_string())
        .collect();
    disks.extend(
        daemon
            .disk_files("jrn", journals, journal_bytes)
            .iter()
            .map(|p| format!("{},usage=journal", p.display())),
    );
    let mut args = vec!["pool", "create", "wb"];
    args.extend(disks.iter().map(String::as_str));
    args.extend(["--slab", "16M"]);
    daemon.cli_json(&args);
}

#[test]
fn sigkill_during_random_writes_loses_no_acknowledged_write() {
    sigkill_during_random_writes(&[]);
}

#[test]
fn sigkill_during_random_writes_with_the_log_read_back_from_its_disks() {
    sigkill_during_random_writes(&["--log-memory", "0"]);
}

fn sigkill_during_random_writes(daemon_args: &[&str]) {
    if skip_without("the write-back cache crash test", &["fio"]) {
        return;
    }
    let mut daemon = Daemon::start_with(daemon_args);
    let read_back = !daemon_args.is_empty();
    journaled_pool(&daemon, 6, 3, GIB);
    let view = daemon.create_space(
        "wb",
        "p",
        &["--layout", "parity", "--redundancy", "2", "--cache", "64M"],
        "128M",
    );
    let cache = &view["cache"];
    assert_eq!(cache["bytes"], 64 << 20, "{view}");
    assert_eq!(cache["log_copies"], 3, "{view}");
    assert_eq!(cache["log_disks"], serde_json::json!([6, 7, 8]), "{view}");

    let dir = daemon.temp().join("fio");
    std::fs::create_dir_all(&dir).unwrap();
    let uri = daemon.uri("p");
    let mut writer = fio(
        &uri,
        &dir,
        &[
            "--do_verify=0",
            "--verify_state_save=1",
            "--time_based",
            "--runtime=60",
        ],
    )
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null())
    .spawn()
    .expect("start fio");
    // Let writes pile up in the log (and some destage), then cut.
    std::thread::sleep(Duration::from_secs(4));
    let status = daemon.cli_json(&["space", "show", "p"]);
    daemon.kill();
    let _ = writer.wait();
    let cache = &status["space"]["cache"];
    assert!(
        cache["absorbed_writes"].as_u64().unwrap_or(0) > 0,
        "no write went through the log: {status}"
    );
    if read_back {
        assert_eq!(cache["memory_bytes"], 0, "{status}");
    } else {
        assert!(cache["memory_bytes"].as_u64().unwrap_or(0) > 0, "{status}");
    }

    daemon.restart();
    let verify = run_with(
        &mut fio(&uri, &dir, &["--verify_only", "--verify_state_load=1"]),
        None,
        Duration::from_secs(300),
    );
    let output = format!("{}{}", verify.stdout, verify.stderr);
    assert!(
        verify.success() && !output.contains("verify:"),
        "fio verify after SIGKILL\n{}",
        verify.describe()
    );
    let check = daemon.cli_json(&["space", "verify", "p"]);
    assert_eq!(check["mismatched_rows"], 0, "{check}");
    assert!(check["rows"].as_u64().unwrap() > 0, "{check}");
    daemon.stop();
}

/// `--log-memory` is the daemon's: each open pool gets an equal share,
/// which grows back when a pool leaves, and `pool status` shows it.
#[test]
fn the_log_memory_is_shared_by_the_pools() {
    let mut daemon = Daemon::start_with(&["--log-memory", "64M"]);
    let share = |daemon: &Daemon, pool: &str| {
        daemon.pool_status(pool)["log_memory_max_bytes"]
            .as_u64()
            .unwrap()
    };
    let a = daemon.disk_files("a", 3, GIB);
    daemon.create_pool("a", &a, "16M");
    daemon.create_space("a", "pa", &["--layout", "parity"], "64M");
    assert_eq!(share(&daemon, "a"), 64 << 20);
    let b = daemon.disk_files("b", 3, GIB);
    daemon.create_pool("b", &b, "16M");
    assert_eq!(share(&daemon, "a"), 32 << 20);
    assert_eq!(share(&daemon, "b"), 32 << 20);
    let text = daemon.cli_ok(&["pool", "status", "a"]).stdout;
    assert!(text.contains("log memory held"), "{text}");
    daemon.cli_ok(&["pool", "export", "b"]);
    assert_eq!(share(&daemon, "a"), 64 << 20);
    daemon.stop();
    daemon.restart();
    assert_eq!(share(&daemon, "a"), 64 << 20);
    daemon.stop();
}

/// `space cache` answers with the cache it made, where its log lives, and
/// refuses a cache the journal disks cannot hold with what it needs.
#[test]
fn space_cache_says_what_it_made_or_what_it_needs() {
    let mut daemon = Daemon::start();
    journaled_pool(&daemon, 3, 2, 256 << 20);
    daemon.create_space("wb", "p", &["--layout", "parity", "--cache", "64M"], "64M");
    let text = daemon.cli_ok(&["space", "cache", "p", "96M"]).stdout;
    assert!(
        text.contains("write-back cache 96M, log on disks 3, 4: 2 copies on journal disks"),
        "{text}"
    );
    let refused = daemon.cli(&["space", "cache", "p", "1G"]);
    assert!(!refused.success(), "{}", refused.describe());
    assert!(
        refused.stderr.contains(
            "not enough free capacity for space p: its write-back cache growing from 96M to 1G"
        ) && refused.stderr.contains("on journal disks"),
        "{}",
        refused.describe()
    );
    let view = daemon.cli_json(&["space", "show", "p"]);
    assert_eq!(view["space"]["cache"]["bytes"], 96 << 20, "{view}");
    // What the log protects against is said for the layout it serves.
    let protects = |view: &serde_json::Value| view["space"]["cache"]["protects"].to_string();
    assert!(protects(&view).contains("no write hole"), "{view}");
    daemon.create_space("wb", "m", &["--layout", "mirror", "--cache", "32M"], "64M");
    let view = daemon.cli_json(&["space", "show", "m"]);
    assert!(
        protects(&view).contains("only the ranges being written are resynced"),
        "{view}"
    );
    daemon.stop();
}
