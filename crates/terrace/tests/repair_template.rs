//! The redundancy template through the daemon and NBD, for every redundant
//! layout: write known data, destroy as many disks as the layout tolerates,
//! read everything back byte-identical, repair, check that redundancy is
//! whole again, lose another disk and still read everything. And beyond
//! tolerance: the space says it is offline, reads of lost extents fail,
//! and no read returns wrong data.

mod common;

use common::{
    assert_reads_back, command, delete_and_wait, disks_of, random_bytes, run, run_ok, skip_without,
    wait_until, Daemon, MIB,
};
use serde_json::Value;

const DISK_BYTES: u64 = 512 * MIB;

/// Layout arguments, columns chosen so that a repair has free disks left.
const LAYOUTS: [(&str, &[&str], usize); 4] = [
    (
        "m2",
        &["--layout", "mirror", "--copies", "2", "--columns", "2"],
        1,
    ),
    (
        "m3",
        &["--layout", "mirror", "--copies", "3", "--columns", "1"],
        2,
    ),
    (
        "p1",
        &["--layout", "parity", "--redundancy", "1", "--columns", "4"],
        1,
    ),
    (
        "p2",
        &["--layout", "parity", "--redundancy", "2", "--columns", "5"],
        2,
    ),
];

fn space(daemon: &Daemon, pool: &str, name: &str) -> Value {
    let status = daemon.pool_status(pool);
    status["spaces"]
        .as_array()
        .and_then(|spaces| spaces.iter().find(|s| s["name"] == name).cloned())
        .unwrap_or_else(|| panic!("space {name} missing: {status}"))
}

#[test]
fn every_redundant_layout_survives_its_tolerance_repairs_and_another_loss() {
    if skip_without("the redundancy template", &["nbdcopy"]) {
        return;
    }
    let mut daemon = Daemon::start();
    for (index, (name, layout, tolerance)) in LAYOUTS.iter().enumerate() {
        let pool = format!("pool-{name}");
        let files = daemon.disk_files(name, 8, DISK_BYTES);
        daemon.create_pool(&pool, &files, "8M");
        daemon.cli_json(&["pool", "set", &pool, "--retire-missing", "never"]);
        daemon.create_space(&pool, name, layout, "32M");
        let source = daemon.temp().join(format!("{name}.in"));
        std::fs::write(&source, random_bytes(40 + index as u64, 32 * MIB as usize))
            .expect("source");
        run_ok(command("nbdcopy").arg(&source).arg(daemon.uri(name)));

        let used = disks_of(&daemon, name);
        for &disk in &used[..*tolerance] {
            delete_and_wait(&daemon, &pool, &files, disk);
        }
        assert_reads_back(&daemon, name, &source, "with the tolerated disks lost");
        assert_ne!(space(&daemon, &pool, name)["health"], "offline");

        daemon.cli_json(&["pool", "set", &pool, "--retire-missing", "always"]);
        wait_until(&daemon, "the repair", || {
            let view = space(&daemon, &pool, name);
            (view["health"] != "healthy").then(|| view.to_string())
        });
        let check = daemon.cli_json(&["space", "verify", name]);
        assert_eq!(check["mismatched_rows"], 0, "{name}: {check}");
        assert_eq!(check["skipped_rows"], 0, "{name}: {check}");
        assert_reads_back(&daemon, name, &source, "after the repair");

        let now_used = disks_of(&daemon, name);
        let next = *now_used
            .iter()
            .find(|disk| files[**disk].exists())
            .expect("a disk left to lose");
        daemon.cli_json(&["pool", "set", &pool, "--retire-missing", "never"]);
        delete_and_wait(&daemon, &pool, &files, next);
        assert_reads_back(&daemon, name, &source, "after losing one more disk");
    }
    daemon.stop();
}

#[test]
fn beyond_tolerance_the_space_is_offline_and_never_returns_wrong_data() {
    if skip_without("the beyond-tolerance test", &["qemu-io"]) {
        return;
    }
    let mut daemon = Daemon::start();
    let files = daemon.disk_files("bt", 5, DISK_BYTES);
    daemon.create_pool("bt", &files, "8M");
    daemon.cli_json(&["pool", "set", "bt", "--retire-missing", "never"]);
    // 3 columns over 5 disks: extents land on different disk sets.
    daemon.create_space(
        "bt",
        "lost",
        &[
            "--layout",
            "parity",
            "--redundancy",
            "1",
            "--columns",
            "3",
            "--cache",
            "0",
        ],
        "96M",
    );
    // One pattern byte per 16 MiB extent (2 data columns × 8 MiB slabs).
    let extent = 16 * MIB;
    let extents = 96 * MIB / extent;
    let mut writes = command("qemu-io");
    writes.args(["-f", "raw"]).arg(daemon.uri("lost"));
    for e in 0..extents {
        writes
            .arg("-c")
            .arg(format!("write -P {} {} {}", 0x40 + e, e * extent, extent));
    }
    run_ok(&mut writes);
    let used = disks_of(&daemon, "lost");
    delete_and_wait(&daemon, "bt", &files, used[0]);
    delete_and_wait(&daemon, "bt", &files, used[1]);
    let view = space(&daemon, "bt", "lost");
    assert_eq!(
        view["health"],
        "offline",
        "{view}\nused {used:?}\n{}",
        daemon.pool_status("bt")["disks"]
    );
    let (mut readable, mut failed) = (0, 0);
    for e in 0..extents {
        let answer = run(command("qemu-io")
            .args(["-f", "raw"])
            .arg(daemon.uri("lost"))
            .arg("-c")
            .arg(format!("read -P {} {} {}", 0x40 + e, e * extent, extent)));
        let output = format!("{}{}", answer.stdout, answer.stderr);
        assert!(
            !output.contains("Pattern verification failed"),
            "extent {e} returned wrong data\n{}",
            answer.describe()
        );
        if answer.success() && !output.contains("failed") {
            readable += 1;
        } else {
            failed += 1;
        }
    }
    assert!(failed > 0, "no read of a lost extent failed");
    assert!(readable > 0, "no surviving extent was readable");
    daemon.stop();
}

fn slabs_used(daemon: &Daemon, pool: &str) -> Vec<u64> {
    daemon.pool_status(pool)["disks"]
        .as_array()
        .expect("disks")
        .iter()
        .map(|disk| disk["slabs_used"].as_u64().unwrap_or(0))
        .collect()
}

fn repair_jobs(daemon: &Daemon) -> Vec<Value> {
    daemon
        .cli_json(&["job", "list"])
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Mid-repair, the disk being repaired onto vanishes: the repair moves to
/// another target and finishes. Then, mid-repair again, a second disk of
/// a single-parity space vanishes: the job fails and says why, the space is
/// offline, and reads never return wrong data.
#[test]
fn a_lost_target_is_replaced_and_a_second_failure_is_reported() {
    if skip_without("the mid-repair failure test", &["nbdcopy"]) {
        return;
    }
    let mut daemon = Daemon::start();
    // Five disks for the space and two hot spares to repair onto, so the
    // repair target holds nothing else of the space.
    let files = daemon.disk_files("mid", 7, DISK_BYTES);
    let specs: Vec<String> = files
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let spare = if i >= 5 { ",usage=hot-spare" } else { "" };
            format!("{}{spare}", f.display())
        })
        .collect();
    let mut create = vec!["pool", "create", "mid"];
    create.extend(specs.iter().map(String::as_str));
    create.extend(["--slab", "8M"]);
    daemon.cli_json(&create);
    daemon.cli_json(&[
        "pool",
        "set",
        "mid",
        "--retire-missing",
        "never",
        "--repair-rate",
        "4M",
    ]);
    daemon.create_space(
        "mid",
        "s",
        &[
            "--layout",
            "parity",
            "--redundancy",
            "1",
            "--columns",
            "3",
            "--cache",
            "0",
        ],
        "64M",
    );
    let source = daemon.temp().join("s.in");
    std::fs::write(&source, random_bytes(77, 32 * MIB as usize)).expect("source");
    run_ok(command("nbdcopy").arg(&source).arg(daemon.uri("s")));

    let used = disks_of(&daemon, "s");
    delete_and_wait(&daemon, "mid", &files, used[0]);
    let before = slabs_used(&daemon, "mid");
    daemon.cli_json(&["pool", "set", "mid", "--retire-missing", "always"]);
    let mut target = None;
    wait_until(&daemon, "a repair target", || {
        let now = slabs_used(&daemon, "mid");
        target = (5..now.len()).find(|&d| now[d] > before[d] && files[d].exists());
        target.is_none().then(|| format!("{before:?} -> {now:?}"))
    });
    delete_and_wait(&daemon, "mid", &files, target.expect("target"));
    wait_until(&daemon, "the repair onto another disk", || {
        let view = space(&daemon, "mid", "s");
        (view["health"] != "healthy").then(|| format!("{view} {:?}", repair_jobs(&daemon)))
    });
    let check = daemon.cli_json(&["space", "verify", "s"]);
    assert_eq!(check["mismatched_rows"], 0, "{check}");
    assert_reads_back(&daemon, "s", &source, "after the target was replaced");

    // A new repair, and a second failure in the middle of it.
    let used = disks_of(&daemon, "s");
    daemon.cli_json(&["pool", "set", "mid", "--retire-missing", "never"]);
    delete_and_wait(&daemon, "mid", &files, used[0]);
    daemon.cli_json(&["pool", "set", "mid", "--retire-missing", "always"]);
    wait_until(&daemon, "the second repair to start", || {
        let running = repair_jobs(&daemon)
            .iter()
            .any(|job| job["state"] == "running");
        (!running).then(|| format!("{:?}", repair_jobs(&daemon)))
    });
    let second = *disks_of(&daemon, "s")
        .iter()
        .find(|&&d| files[d].exists())
        .expect("another disk of the space");
    delete_and_wait(&daemon, "mid", &files, second);
    wait_until(&daemon, "the repair to give up", || {
        let failed = repair_jobs(&daemon).iter().any(|job| {
            job["state"] == "failed" && !job["reason"].as_str().unwrap_or("").is_empty()
        });
        (!failed).then(|| format!("{:?}", repair_jobs(&daemon)))
    });
    let view = space(&daemon, "mid", "s");
    assert_eq!(view["health"], "offline", "{view}");
    let copy = daemon.temp().join("s.partial");
    let answer = run(command("nbdcopy").arg(daemon.uri("s")).arg(&copy));
    assert!(
        !answer.success(),
        "a read of lost extents must fail\n{}",
        answer.describe()
    );
    daemon.stop();
}
